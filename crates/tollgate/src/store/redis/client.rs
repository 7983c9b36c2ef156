//! Redis clients as tollgate opens them, and the one call shape the redis crate lacks.

use redis::aio::ConnectionManager;

/// A client for `url` whose connections send at once (`TCP_NODELAY`). The redis crate leaves
/// Nagle's algorithm on, which may hold a pipelined call back until the previous one is
/// acknowledged; coalescing keeps several calls in flight on one connection.
pub(super) fn open_client(url: &str) -> redis::RedisResult<redis::Client> {
    use redis::IntoConnectionInfo;
    let info = url
        .into_connection_info()?
        .set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true));
    redis::Client::open(info)
}

/// Runs `invocation` behind `ASKING` (one pipeline, so nothing else runs between them on the
/// shared connection), loading the script first if the node lacks it.
pub(super) async fn invoke_asking<T: redis::FromRedisValue>(
    connection: &mut ConnectionManager,
    invocation: &redis::ScriptInvocation<'_>,
) -> redis::RedisResult<T> {
    let mut asking = redis::pipe();
    asking.cmd("ASKING").ignore().invoke_script(invocation);
    match asking.query_async::<(T,)>(connection).await {
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            invocation.load_async(connection).await?;
            asking.query_async::<(T,)>(connection).await.map(|(t,)| t)
        }
        answer => answer.map(|(t,)| t),
    }
}
