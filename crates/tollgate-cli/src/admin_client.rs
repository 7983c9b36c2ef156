//! A small blocking client for the admin API, shared by `policy` and `top`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use serde_json::Value;

/// Where the admin API is and how to authenticate.
#[derive(Debug, Args)]
pub struct AdminArgs {
    /// Base URL of the server's admin API.
    #[arg(
        long = "admin",
        global = true,
        default_value = "http://127.0.0.1:9090",
        value_name = "URL"
    )]
    url: String,
    /// File holding the admin bearer token (or set `TOLLGATE_ADMIN_TOKEN`).
    #[arg(long, global = true, value_name = "PATH")]
    token_file: Option<PathBuf>,
}

/// The admin token from `file`, else from `TOLLGATE_ADMIN_TOKEN`, read the same way by `serve`
/// and by the clients: surrounding whitespace (a file's final newline) is not part of it. An
/// empty variable is no token; an empty file is an error (a token was meant, and `serve` would
/// otherwise run its admin API without one).
pub fn read_token(file: Option<&Path>) -> anyhow::Result<Option<String>> {
    read_token_or(file, "TOLLGATE_ADMIN_TOKEN")
}

/// A token from `file`, else from the variable `var`, read as [`read_token`] reads.
pub fn read_token_or(file: Option<&Path>, var: &str) -> anyhow::Result<Option<String>> {
    let Some(path) = file else {
        let token = std::env::var(var)
            .ok()
            .map(|t| t.trim().to_owned())
            .filter(|t| !t.is_empty());
        if let Some(t) = &token {
            bearer_safe(t, var)?;
        }
        return Ok(token);
    };
    let token = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the admin token file {}", path.display()))?;
    let token = token.trim();
    if token.is_empty() {
        anyhow::bail!("the admin token file {} is empty", path.display());
    }
    bearer_safe(token, &format!("the admin token file {}", path.display()))?;
    Ok(Some(token.to_owned()))
}

/// Refuses a token an `Authorization: Bearer` header cannot carry as it is (non-ASCII, a space,
/// a second line): `serve` would start, and every client would then be refused.
fn bearer_safe(token: &str, source: &str) -> anyhow::Result<()> {
    if let Some(c) = token.chars().find(|c| !c.is_ascii_graphic()) {
        anyhow::bail!(
            "{source} holds {c:?}: an admin token is visible ASCII only, one line without spaces, as a Bearer header carries it"
        );
    }
    Ok(())
}

/// Talks to one server's admin API.
#[derive(Debug)]
pub struct AdminClient {
    base: String,
    token: Option<String>,
    runtime: tokio::runtime::Runtime,
    http: reqwest::Client,
}

impl AdminClient {
    pub fn new(args: &AdminArgs) -> anyhow::Result<Self> {
        let token = read_token(args.token_file.as_deref())?;
        Ok(AdminClient {
            base: args.url.trim_end_matches('/').to_owned(),
            token,
            runtime: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()?,
        })
    }

    fn request(&self, method: &str, path: &str) -> anyhow::Result<reqwest::RequestBuilder> {
        let method = reqwest::Method::from_bytes(method.as_bytes())?;
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        Ok(request)
    }

    /// Sends a request with an optional JSON body; returns the status and the JSON answer.
    pub fn send(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<(u16, Value)> {
        let mut request = self.request(method, path)?;
        if let Some(body) = body {
            request = request.json(&body);
        } else if !matches!(method, "GET" | "HEAD") {
            // The server takes a write only marked as JSON, body or not (a cross-site form
            // cannot send that).
            request = request.header(reqwest::header::CONTENT_TYPE, "application/json");
        }
        self.runtime.block_on(async {
            let response = self.execute(request, path).await?;
            let status = response.status().as_u16();
            let body: Value = response
                .json()
                .await
                .context("the server's answer is not JSON")?;
            Ok((status, body))
        })
    }

    /// Sends a request and returns the status and the answer as text.
    pub fn send_text(&self, method: &str, path: &str) -> anyhow::Result<(u16, String)> {
        let request = self.request(method, path)?;
        self.runtime.block_on(async {
            let response = self.execute(request, path).await?;
            Ok((response.status().as_u16(), response.text().await?))
        })
    }

    async fn execute(
        &self,
        request: reqwest::RequestBuilder,
        path: &str,
    ) -> anyhow::Result<reqwest::Response> {
        request
            .send()
            .await
            .with_context(|| format!("could not reach {}{path}", self.base))
    }
}

/// The JSON answer of a `200`, or an error with the server's `error` (and its `problems`, one
/// a line on stderr).
pub fn expect_ok((status, body): (u16, Value)) -> anyhow::Result<Value> {
    if status == 200 {
        return Ok(body);
    }
    let error = body["error"].as_str().unwrap_or("request failed");
    for problem in body["problems"].as_array().cloned().unwrap_or_default() {
        crate::stdout::errln!("{}", problem.as_str().unwrap_or_default());
    }
    anyhow::bail!("server answered {status}: {error}")
}
