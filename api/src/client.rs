//! A small blocking HTTP/1.1 client for the API, over the unix socket or TCP: what
//! `rtgtctl` and the end-to-end tests use. One request per connection.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::server::ErrorBody;

/// Where the API is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    Unix(PathBuf),
    /// `host:port`.
    Tcp(String),
}

/// A failed call.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach the API at {endpoint}: {source}")]
    Connect {
        endpoint: String,
        #[source]
        source: io::Error,
    },
    #[error("API I/O: {0}")]
    Io(#[from] io::Error),
    #[error("malformed HTTP response: {0}")]
    Protocol(String),
    #[error("HTTP {status}: {message}{}", field.as_ref().map(|f| format!(" (field {f})")).unwrap_or_default())]
    Http {
        status: u16,
        message: String,
        field: Option<String>,
    },
    #[error("unexpected answer: {0}")]
    Decode(#[from] serde_json::Error),
    #[error("invalid URL {0:?}: expected http://HOST:PORT")]
    Url(String),
}

/// An HTTP response.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The error body of a 4xx/5xx answer.
    pub fn error(&self) -> Option<ErrorBody> {
        serde_json::from_slice(&self.body).ok()
    }
}

/// An API client.
#[derive(Debug, Clone)]
pub struct Client {
    pub endpoint: Endpoint,
    pub token: Option<String>,
    pub timeout: Duration,
}

trait Stream: Read + Write {}
impl<T: Read + Write> Stream for T {}

impl Client {
    pub fn unix(path: impl Into<PathBuf>) -> Client {
        Client {
            endpoint: Endpoint::Unix(path.into()),
            token: None,
            timeout: Duration::from_secs(60),
        }
    }

    /// A client for `http://HOST:PORT` (a path after it is ignored).
    pub fn url(url: &str) -> Result<Client, ClientError> {
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| ClientError::Url(url.into()))?;
        let hostport = rest.split('/').next().unwrap_or("");
        if hostport.is_empty() || !hostport.contains(':') {
            return Err(ClientError::Url(url.into()));
        }
        Ok(Client {
            endpoint: Endpoint::Tcp(hostport.to_string()),
            token: None,
            timeout: Duration::from_secs(60),
        })
    }

    pub fn with_token(mut self, token: Option<String>) -> Client {
        self.token = token;
        self
    }

    fn connect(&self) -> Result<Box<dyn Stream>, ClientError> {
        let fail = |source| ClientError::Connect {
            endpoint: match &self.endpoint {
                Endpoint::Unix(p) => p.display().to_string(),
                Endpoint::Tcp(a) => a.clone(),
            },
            source,
        };
        Ok(match &self.endpoint {
            Endpoint::Unix(p) => {
                let s = UnixStream::connect(p).map_err(fail)?;
                s.set_read_timeout(Some(self.timeout))?;
                Box::new(s)
            }
            Endpoint::Tcp(a) => {
                let s = TcpStream::connect(a.as_str()).map_err(fail)?;
                s.set_read_timeout(Some(self.timeout))?;
                Box::new(s)
            }
        })
    }

    /// Sends one request and reads the whole response, whatever its status.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: &[u8],
    ) -> Result<Reply, ClientError> {
        let mut s = self.connect()?;
        let host = match &self.endpoint {
            Endpoint::Unix(_) => "localhost".to_string(),
            Endpoint::Tcp(a) => a.clone(),
        };
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nAccept: application/json\r\nContent-Length: {}\r\n",
            body.len()
        );
        if let Some(ct) = content_type {
            head.push_str(&format!("Content-Type: {ct}\r\n"));
        }
        if let Some(t) = &self.token {
            head.push_str(&format!("Authorization: Bearer {t}\r\n"));
        }
        head.push_str("\r\n");
        // A server may answer before reading the whole body (413) and close: read its
        // answer even when sending the rest failed.
        let sent = s
            .write_all(head.as_bytes())
            .and_then(|_| s.write_all(body))
            .and_then(|_| s.flush());
        match read_reply(BufReader::new(s)) {
            Ok(r) => Ok(r),
            Err(e) => match sent {
                Err(w) => Err(ClientError::Io(w)),
                Ok(()) => Err(e),
            },
        }
    }

    fn check(reply: Reply) -> Result<Reply, ClientError> {
        if reply.status >= 400 {
            let (message, field) = match reply.error() {
                Some(e) => (e.error, e.field),
                None => (reply.text(), None),
            };
            return Err(ClientError::Http {
                status: reply.status,
                message,
                field,
            });
        }
        Ok(reply)
    }

    /// GET, decoding a JSON answer.
    pub fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        let r = Self::check(self.request("GET", path, None, &[])?)?;
        Ok(serde_json::from_slice(&r.body)?)
    }

    /// GET of a text answer.
    pub fn get_text(&self, path: &str) -> Result<String, ClientError> {
        Ok(Self::check(self.request("GET", path, None, &[])?)?.text())
    }

    /// A method with a JSON body; decodes the JSON answer (`null` for 204).
    pub fn send<B: Serialize>(
        &self,
        method: &str,
        path: &str,
        body: &B,
    ) -> Result<serde_json::Value, ClientError> {
        let bytes = serde_json::to_vec(body)?;
        let r = Self::check(self.request(method, path, Some("application/json"), &bytes)?)?;
        if r.body.is_empty() {
            return Ok(serde_json::Value::Null);
        }
        Ok(serde_json::from_slice(&r.body)?)
    }

    pub fn delete(&self, path: &str) -> Result<(), ClientError> {
        Self::check(self.request("DELETE", path, None, &[])?)?;
        Ok(())
    }

    /// PUT of a YAML configuration document.
    pub fn apply_yaml(&self, yaml: &str) -> Result<crate::ChangeReport, ClientError> {
        let r = Self::check(self.request(
            "PUT",
            "/api/v1/config",
            Some("application/yaml"),
            yaml.as_bytes(),
        )?)?;
        Ok(serde_json::from_slice(&r.body)?)
    }
}

/// Largest response body accepted.
const MAX_REPLY: usize = 64 << 20;

/// Percent-encodes a path segment (iSCSI names hold ':', portals '[' and ']').
pub fn segment(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~:".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Parses a complete HTTP/1.1 response.
pub fn parse_reply(bytes: &[u8]) -> Result<Reply, ClientError> {
    read_reply(bytes)
}

fn read_reply(mut r: impl BufRead) -> Result<Reply, ClientError> {
    let mut line = String::new();
    r.read_line(&mut line)?;
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| ClientError::Protocol(format!("status line {line:?}")))?;
    let mut headers = Vec::new();
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            return Err(ClientError::Protocol("headers cut short".into()));
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        let (k, v) = l
            .split_once(':')
            .ok_or_else(|| ClientError::Protocol(format!("header {l:?}")))?;
        headers.push((k.trim().to_string(), v.trim().to_string()));
    }
    let get = |n: &str| {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(n))
            .map(|(_, v)| v.clone())
    };
    let mut body = Vec::new();
    if get("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        loop {
            line.clear();
            r.read_line(&mut line)?;
            let n = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
                .map_err(|_| ClientError::Protocol(format!("chunk size {line:?}")))?;
            if n == 0 {
                break;
            }
            if n > MAX_REPLY || body.len() + n > MAX_REPLY {
                return Err(ClientError::Protocol("response too large".into()));
            }
            let start = body.len();
            body.resize(start + n, 0);
            r.read_exact(&mut body[start..])?;
            line.clear();
            r.read_line(&mut line)?;
        }
    } else if let Some(n) = get("content-length").and_then(|v| v.parse::<usize>().ok()) {
        if n > MAX_REPLY {
            return Err(ClientError::Protocol("response too large".into()));
        }
        body.resize(n, 0);
        r.read_exact(&mut body)?;
    } else {
        r.read_to_end(&mut body)?;
    }
    Ok(Reply {
        status,
        headers,
        body,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_replies() {
        let r = read_reply(&b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: 14\r\n\r\n{\"error\":\"no\"}x"[..]).unwrap();
        assert_eq!(r.status, 404);
        assert_eq!(r.error().unwrap().error, "no");
        let r = read_reply(
            &b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"[..],
        )
        .unwrap();
        assert_eq!(r.body, b"abcde");
        assert!(read_reply(&b"garbage\r\n\r\n"[..]).is_err());
    }

    #[test]
    fn urls_and_segments() {
        assert_eq!(
            Client::url("http://10.0.0.1:8080/").unwrap().endpoint,
            Endpoint::Tcp("10.0.0.1:8080".into())
        );
        assert!(Client::url("https://x:1").is_err());
        assert_eq!(segment("iqn.2025-01.io.rtgt:t"), "iqn.2025-01.io.rtgt:t");
        assert_eq!(segment("[::1]:3260"), "%5B::1%5D:3260");
    }
}
