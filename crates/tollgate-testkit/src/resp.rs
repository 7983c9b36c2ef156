//! A minimal RESP2 client: enough to poll readiness and cluster state without spawning `redis-cli`
//! every few milliseconds.

use std::io::{self, BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::Duration;

/// Bound on connecting, sending and reading, so a stopped (`SIGSTOP`) node cannot hang a poll.
const IO_TIMEOUT: Duration = Duration::from_millis(1_000);

/// One RESP2 reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    Status(String),
    Error(String),
    Integer(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Reply>>),
}

/// Sends one command to `127.0.0.1:port` on a fresh connection and reads its reply.
pub(crate) fn command(port: u16, args: &[&str]) -> io::Result<Reply> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let stream = TcpStream::connect_timeout(&addr, IO_TIMEOUT)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    (&stream).write_all(&encode(args))?;
    read_reply(&mut BufReader::new(&stream))
}

/// Sends one command and returns its status or bulk-string reply as text; an error reply is `Err`.
pub(crate) fn text(port: u16, args: &[&str]) -> io::Result<String> {
    match command(port, args)? {
        Reply::Status(text) => Ok(text),
        Reply::Bulk(Some(bytes)) => Ok(String::from_utf8_lossy(&bytes).into_owned()),
        Reply::Error(message) => Err(io::Error::other(message)),
        other => Err(io::Error::other(format!("unexpected reply {other:?}"))),
    }
}

fn encode(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out
}

fn read_reply(reader: &mut impl BufRead) -> io::Result<Reply> {
    let line = read_line(reader)?;
    let (kind, rest) = line.split_at(1.min(line.len()));
    match kind {
        "+" => Ok(Reply::Status(rest.to_owned())),
        "-" => Ok(Reply::Error(rest.to_owned())),
        ":" => Ok(Reply::Integer(parse_int(rest)?)),
        "$" => {
            let Ok(len) = usize::try_from(parse_int(rest)?) else {
                return Ok(Reply::Bulk(None));
            };
            let mut body = vec![0; len + 2];
            reader.read_exact(&mut body)?;
            if !body.ends_with(b"\r\n") {
                return Err(invalid("bulk string not terminated by CRLF"));
            }
            body.truncate(len);
            Ok(Reply::Bulk(Some(body)))
        }
        "*" => {
            let Ok(count) = usize::try_from(parse_int(rest)?) else {
                return Ok(Reply::Array(None));
            };
            let items = (0..count)
                .map(|_| read_reply(reader))
                .collect::<io::Result<_>>()?;
            Ok(Reply::Array(Some(items)))
        }
        _ => Err(invalid(&format!("unknown reply line {line:?}"))),
    }
}

fn read_line(reader: &mut impl BufRead) -> io::Result<String> {
    let mut line = String::new();
    reader.read_line(&mut line)?;
    match line.strip_suffix("\r\n") {
        Some(content) => Ok(content.to_owned()),
        None => Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("reply line not terminated by CRLF: {line:?}"),
        )),
    }
}

fn parse_int(text: &str) -> io::Result<i64> {
    text.parse()
        .map_err(|_| invalid(&format!("bad integer {text:?}")))
}

fn invalid(message: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(bytes: &[u8]) -> io::Result<Reply> {
        read_reply(&mut &bytes[..])
    }

    #[test]
    fn encodes_commands_as_arrays_of_bulk_strings() {
        assert_eq!(encode(&["GET", "k"]), b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n");
        assert_eq!(encode(&[""]), b"*1\r\n$0\r\n\r\n");
    }

    #[test]
    fn parses_every_reply_kind() {
        assert_eq!(parse(b"+PONG\r\n").unwrap(), Reply::Status("PONG".into()));
        assert_eq!(
            parse(b"-ERR no\r\n").unwrap(),
            Reply::Error("ERR no".into())
        );
        assert_eq!(parse(b":-42\r\n").unwrap(), Reply::Integer(-42));
        assert_eq!(
            parse(b"$4\r\na\r\nb\r\n").unwrap(),
            Reply::Bulk(Some(b"a\r\nb".to_vec()))
        );
        assert_eq!(parse(b"$-1\r\n").unwrap(), Reply::Bulk(None));
        assert_eq!(parse(b"*-1\r\n").unwrap(), Reply::Array(None));
        assert_eq!(
            parse(b"*2\r\n:1\r\n*1\r\n$1\r\nx\r\n").unwrap(),
            Reply::Array(Some(vec![
                Reply::Integer(1),
                Reply::Array(Some(vec![Reply::Bulk(Some(b"x".to_vec()))])),
            ]))
        );
    }

    #[test]
    fn rejects_truncated_or_malformed_replies() {
        assert!(parse(b"+PONG").is_err());
        assert!(parse(b"$5\r\nab\r\n").is_err());
        assert!(parse(b":x\r\n").is_err());
        assert!(parse(b"?\r\n").is_err());
        assert!(parse(b"").is_err());
    }
}
