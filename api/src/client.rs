//! A small blocking HTTP/1.1 client for the API, over the unix socket or TCP: what
//! `rtgtctl` and the end-to-end tests use. One request per connection.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{IpAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::config::Lun;
pub use crate::resource::segment;
use crate::resource::{collection_path, PortKind, PortPath};
use crate::server::ErrorBody;

/// Where the API is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    Unix(PathBuf),
    /// `host:port`, plain HTTP.
    Tcp(String),
    /// `host:port`, HTTP over TLS.
    Https(String),
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Unix(p) => write!(f, "unix socket {}", p.display()),
            Endpoint::Tcp(a) => write!(f, "http://{a}"),
            Endpoint::Https(a) => write!(f, "https://{a}"),
        }
    }
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
    #[error("invalid URL {0:?}: expected http://HOST:PORT or https://HOST:PORT")]
    Url(String),
    #[error("TLS with {endpoint}: {message}")]
    Tls { endpoint: String, message: String },
    /// The API or the credentials could not be found.
    #[error("{0}")]
    Setup(String),
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

/// The system's CA certificates, trusted for `https://` URLs without a CA file.
pub const SYSTEM_CA_FILE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// An API client.
#[derive(Debug, Clone)]
pub struct Client {
    pub endpoint: Endpoint,
    pub token: Option<String>,
    pub timeout: Duration,
    /// TLS settings for `https://`; the system's CA certificates when absent.
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

trait Stream: Read + Write {}
impl<T: Read + Write> Stream for T {}

/// Splits `host:port` (`[v6]:port` too) into the host, without brackets, and the port.
fn split_host_port(hostport: &str) -> Option<(&str, u16)> {
    let (host, port) = match hostport.strip_prefix('[') {
        Some(rest) => {
            let (h, p) = rest.split_once("]:")?;
            (h, p)
        }
        None => hostport.rsplit_once(':')?,
    };
    if host.is_empty() || (hostport.starts_with('[') && host.parse::<IpAddr>().is_err()) {
        return None;
    }
    Some((host, port.parse().ok()?))
}

/// Whether `host:port` names this machine by a loopback address or `localhost`.
pub fn is_loopback(hostport: &str) -> bool {
    split_host_port(hostport).is_some_and(|(h, _)| {
        h.eq_ignore_ascii_case("localhost") || h.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
    })
}

/// A TLS client configuration trusting the certificates of a PEM file.
pub fn tls_config(ca_file: &Path) -> Result<Arc<rustls::ClientConfig>, ClientError> {
    let fail =
        |message: String| ClientError::Setup(format!("CA file {}: {message}", ca_file.display()));
    let mut roots = rustls::RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(ca_file)
        .map_err(|e| fail(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| fail(e.to_string()))?;
    let (added, _) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err(fail("no PEM certificate in it".into()));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ClientError::Setup(format!("TLS: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// Explains a failed TLS handshake.
fn tls_error(endpoint: &str, e: io::Error) -> ClientError {
    let message = match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
        Some(rustls::Error::InvalidCertificate(c)) => format!(
            "the server's certificate is not trusted ({c:?}): give its CA certificate (or, \
             self-signed, the certificate itself) with --ca-file"
        ),
        Some(other) => other.to_string(),
        None => e.to_string(),
    };
    ClientError::Tls {
        endpoint: endpoint.to_string(),
        message,
    }
}

impl Client {
    pub fn unix(path: impl Into<PathBuf>) -> Client {
        Client {
            endpoint: Endpoint::Unix(path.into()),
            token: None,
            timeout: Duration::from_secs(60),
            tls: None,
        }
    }

    /// A client for `http://HOST:PORT` or `https://HOST:PORT` (a path after it is ignored).
    pub fn url(url: &str) -> Result<Client, ClientError> {
        let (tls, rest) = match (url.strip_prefix("http://"), url.strip_prefix("https://")) {
            (Some(r), _) => (false, r),
            (_, Some(r)) => (true, r),
            _ => return Err(ClientError::Url(url.into())),
        };
        let hostport = rest.split('/').next().unwrap_or("");
        if split_host_port(hostport).is_none() {
            return Err(ClientError::Url(url.into()));
        }
        let hostport = hostport.to_string();
        Ok(Client {
            endpoint: if tls {
                Endpoint::Https(hostport)
            } else {
                Endpoint::Tcp(hostport)
            },
            token: None,
            timeout: Duration::from_secs(60),
            tls: None,
        })
    }

    pub fn with_token(mut self, token: Option<String>) -> Client {
        self.token = token;
        self
    }

    /// Trusts the certificates of a PEM file for `https://` (for a self-signed server
    /// certificate, the certificate itself) instead of the system's.
    pub fn with_ca_file(mut self, ca_file: &Path) -> Result<Client, ClientError> {
        self.tls = Some(tls_config(ca_file)?);
        Ok(self)
    }

    fn connect(&self) -> Result<Box<dyn Stream>, ClientError> {
        let fail = |source| ClientError::Connect {
            endpoint: match &self.endpoint {
                Endpoint::Unix(p) => p.display().to_string(),
                Endpoint::Tcp(a) | Endpoint::Https(a) => a.clone(),
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
            Endpoint::Https(a) => {
                let config = match &self.tls {
                    Some(c) => c.clone(),
                    None if Path::new(SYSTEM_CA_FILE).exists() => {
                        tls_config(Path::new(SYSTEM_CA_FILE))?
                    }
                    None => {
                        return Err(ClientError::Tls {
                            endpoint: a.clone(),
                            message: format!(
                                "no CA certificates to check the server with ({SYSTEM_CA_FILE} \
                                 is missing): give them with --ca-file"
                            ),
                        })
                    }
                };
                let host = split_host_port(a)
                    .map(|(h, _)| h.to_string())
                    .ok_or_else(|| ClientError::Url(a.clone()))?;
                let name = ServerName::try_from(host).map_err(|e| ClientError::Tls {
                    endpoint: a.clone(),
                    message: e.to_string(),
                })?;
                let mut conn =
                    rustls::ClientConnection::new(config, name).map_err(|e| ClientError::Tls {
                        endpoint: a.clone(),
                        message: e.to_string(),
                    })?;
                let mut s = TcpStream::connect(a.as_str()).map_err(fail)?;
                s.set_read_timeout(Some(self.timeout))?;
                while conn.is_handshaking() {
                    conn.complete_io(&mut s).map_err(|e| tls_error(a, e))?;
                }
                Box::new(rustls::StreamOwned::new(conn, s))
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
            Endpoint::Tcp(a) | Endpoint::Https(a) => a.clone(),
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
        self.put_config(yaml, "/api/v1/config")
    }

    /// What applying a YAML configuration document would change; changes nothing. An
    /// rtgtd that does not know dry runs would apply the document: its OpenAPI document is
    /// asked first.
    pub fn dry_run_yaml(&self, yaml: &str) -> Result<crate::ChangeReport, ClientError> {
        let doc: serde_json::Value = self.get("/api/v1/openapi.json")?;
        let knows = doc
            .pointer("/paths/~1api~1v1~1config/put/parameters")
            .and_then(|p| p.as_array())
            .is_some_and(|p| p.iter().any(|p| p["name"] == "dry_run"));
        if !knows {
            return Err(ClientError::Setup(
                "this rtgtd cannot do dry runs (it is older than this rtgtctl): nothing was sent"
                    .into(),
            ));
        }
        self.put_config(yaml, "/api/v1/config?dry_run=true")
    }

    fn put_config(&self, yaml: &str, path: &str) -> Result<crate::ChangeReport, ClientError> {
        let r =
            Self::check(self.request("PUT", path, Some("application/yaml"), yaml.as_bytes())?)?;
        Ok(serde_json::from_slice(&r.body)?)
    }
}

// ---- ports of every fabric ----

/// The ports of every fabric (iSCSI portal groups, SRP target ports), their LUNs and their
/// ACLs, alike.
impl Client {
    /// The ports of kind `K` in the collection of `parent`.
    pub fn ports<K: PortKind>(&self, parent: &K::Parent) -> Result<Vec<K>, ClientError> {
        self.get(&collection_path::<K>(parent))
    }

    /// Creates a port; answers with it as created (secrets shown as `********`).
    pub fn create_port<K: PortKind>(&self, parent: &K::Parent, port: &K) -> Result<K, ClientError> {
        let created = self.send("POST", &collection_path::<K>(parent), port)?;
        Ok(serde_json::from_value(created)?)
    }

    pub fn port<K: PortKind>(&self, port: &PortPath<K>) -> Result<K, ClientError> {
        self.get(port.as_str())
    }

    pub fn delete_port<K: PortKind>(&self, port: &PortPath<K>) -> Result<(), ClientError> {
        self.delete(port.as_str())
    }

    pub fn luns<K: PortKind>(&self, port: &PortPath<K>) -> Result<Vec<Lun>, ClientError> {
        self.get(&port.luns())
    }

    /// Maps a backstore as a LUN of the port.
    pub fn add_lun<K: PortKind>(&self, port: &PortPath<K>, lun: &Lun) -> Result<(), ClientError> {
        self.send("POST", &port.luns(), lun).map(drop)
    }

    pub fn remove_lun<K: PortKind>(&self, port: &PortPath<K>, lun: u64) -> Result<(), ClientError> {
        self.delete(&port.lun(lun))
    }

    pub fn acls<K: PortKind>(&self, port: &PortPath<K>) -> Result<Vec<K::Acl>, ClientError> {
        self.get(&port.acls())
    }

    /// Admits an initiator to the port.
    pub fn add_acl<K: PortKind>(
        &self,
        port: &PortPath<K>,
        acl: &K::Acl,
    ) -> Result<(), ClientError> {
        self.send("POST", &port.acls(), acl).map(drop)
    }

    pub fn remove_acl<K: PortKind>(
        &self,
        port: &PortPath<K>,
        initiator: &str,
    ) -> Result<(), ClientError> {
        self.delete(&port.acl(initiator))
    }
}

// ---- finding the API ----

/// The socket `cargo run --bin rtgtd` makes (default state directory `./rtgt-state`).
pub const LOCAL_SOCKET: &str = "./rtgt-state/rtgtd.sock";
/// The socket of the packaged service (`$RUNTIME_DIRECTORY`).
pub const RUN_SOCKET: &str = "/run/rtgt/rtgtd.sock";
/// Where installs of earlier versions had the socket.
pub const LEGACY_SOCKET: &str = "/var/lib/rtgt/rtgtd.sock";
/// Admin token files tried, in order, for an API on a loopback address.
pub const TOKEN_FILES: [&str; 2] = ["./rtgt-state/api-token", "/var/lib/rtgt/api-token"];

/// What the command line says about the API (`None`: not given).
#[derive(Debug, Clone, Default)]
pub struct Given {
    pub socket: Option<PathBuf>,
    pub url: Option<String>,
    pub token: Option<String>,
    pub token_file: Option<PathBuf>,
    pub ca_file: Option<PathBuf>,
}

/// What finding the API may look at.
pub trait Probe {
    /// An environment variable, when set and not empty.
    fn env(&self, name: &str) -> Option<String>;
    /// Whether something is at `path` (also when it is there but cannot be looked at).
    fn exists(&self, path: &Path) -> bool;
    /// A file's contents.
    fn read(&self, path: &Path) -> io::Result<String>;
}

/// The real environment and file system.
pub struct System;

impl Probe for System {
    fn env(&self, name: &str) -> Option<String> {
        std::env::var(name).ok().filter(|v| !v.is_empty())
    }

    fn exists(&self, path: &Path) -> bool {
        match std::fs::symlink_metadata(path) {
            Ok(_) => true,
            Err(e) => e.kind() != io::ErrorKind::NotFound,
        }
    }

    fn read(&self, path: &Path) -> io::Result<String> {
        std::fs::read_to_string(path)
    }
}

/// Where the API is and how to talk to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub endpoint: Endpoint,
    pub token: Option<String>,
    /// CA certificates for `https://`.
    pub ca_file: Option<PathBuf>,
    /// Why each was chosen (never the token itself), for `--verbose`.
    pub notes: Vec<String>,
}

impl Found {
    pub fn client(&self) -> Result<Client, ClientError> {
        let mut c = match &self.endpoint {
            Endpoint::Unix(p) => Client::unix(p),
            e => Client {
                endpoint: e.clone(),
                ..Client::unix("")
            },
        };
        c.token = self.token.clone();
        match (&self.endpoint, &self.ca_file) {
            (Endpoint::Https(_), Some(f)) => c.with_ca_file(f),
            _ => Ok(c),
        }
    }
}

/// Finds the API: `--socket` or `--url`; else `RTGT_SOCKET` or `RTGT_URL`; else the first
/// socket present of [`LOCAL_SOCKET`], [`RUN_SOCKET`] and [`LEGACY_SOCKET`]. The token:
/// `--token`, `--token-file`, `RTGT_TOKEN`, `RTGT_TOKEN_FILE`; else, for an API on a
/// loopback address, the first readable of [`TOKEN_FILES`]. CA certificates: `--ca-file`,
/// `RTGT_CA_FILE`.
pub fn discover(given: &Given, probe: &dyn Probe) -> Result<Found, ClientError> {
    let mut notes = Vec::new();
    let from_url = |u: &str| Client::url(u).map(|c| c.endpoint);
    let (endpoint, why) =
        if let Some(s) = &given.socket {
            (Endpoint::Unix(s.clone()), "--socket")
        } else if let Some(u) = &given.url {
            (from_url(u)?, "--url")
        } else {
            match (probe.env("RTGT_SOCKET"), probe.env("RTGT_URL")) {
                (Some(_), Some(_)) => return Err(ClientError::Setup(
                    "RTGT_SOCKET and RTGT_URL are both set: unset one, or choose with --socket \
                     or --url"
                        .into(),
                )),
                (Some(s), None) => (Endpoint::Unix(s.into()), "RTGT_SOCKET"),
                (None, Some(u)) => (from_url(&u)?, "RTGT_URL"),
                (None, None) => {
                    let places = [
                        (LOCAL_SOCKET, "found in the working directory"),
                        (RUN_SOCKET, "found in rtgtd's runtime directory"),
                        (
                            LEGACY_SOCKET,
                            "found in the state directory of an older install",
                        ),
                    ];
                    match places.iter().find(|(p, _)| probe.exists(Path::new(p))) {
                        Some((p, why)) => (Endpoint::Unix(PathBuf::from(p)), *why),
                        None => {
                            return Err(ClientError::Setup(format!(
                            "cannot find rtgtd's API: no socket at {LOCAL_SOCKET}, {RUN_SOCKET} \
                             or {LEGACY_SOCKET}; give --socket PATH or --url URL (or set \
                             RTGT_SOCKET or RTGT_URL)"
                        )))
                        }
                    }
                }
            }
        };
    notes.push(format!("API at {endpoint} ({why})"));

    let read_token = |f: &Path, why: &str| -> Result<String, ClientError> {
        let t = probe
            .read(f)
            .map_err(|e| {
                ClientError::Setup(format!(
                    "cannot read the token file {} ({why}): {e}",
                    f.display()
                ))
            })?
            .trim()
            .to_string();
        if t.is_empty() {
            return Err(ClientError::Setup(format!(
                "the token file {} ({why}) is empty",
                f.display()
            )));
        }
        Ok(t)
    };
    let token = if let Some(t) = &given.token {
        notes.push("token from --token".into());
        Some(t.clone())
    } else if let Some(f) = &given.token_file {
        let t = read_token(f, "--token-file")?;
        notes.push(format!("token from {} (--token-file)", f.display()));
        Some(t)
    } else if let Some(t) = probe.env("RTGT_TOKEN") {
        notes.push("token from RTGT_TOKEN".into());
        Some(t)
    } else if let Some(f) = probe.env("RTGT_TOKEN_FILE") {
        let t = read_token(Path::new(&f), "RTGT_TOKEN_FILE")?;
        notes.push(format!("token from {f} (RTGT_TOKEN_FILE)"));
        Some(t)
    } else {
        match &endpoint {
            Endpoint::Unix(_) => None,
            Endpoint::Tcp(a) | Endpoint::Https(a) if is_loopback(a) => {
                // Read when it can be: without the right to, there is just no token.
                let found = TOKEN_FILES.iter().find_map(|f| {
                    let t = probe.read(Path::new(f)).ok()?.trim().to_string();
                    (!t.is_empty()).then_some((f, t))
                });
                match found {
                    Some((f, t)) => {
                        notes.push(format!("token from {f}"));
                        Some(t)
                    }
                    None => {
                        notes.push(format!(
                            "no token: none of {} can be read",
                            TOKEN_FILES.join(", ")
                        ));
                        None
                    }
                }
            }
            Endpoint::Tcp(_) | Endpoint::Https(_) => {
                notes.push("no token (give one with --token-file)".into());
                None
            }
        }
    };

    let ca_file = match (&given.ca_file, probe.env("RTGT_CA_FILE")) {
        (Some(f), _) => Some((f.clone(), "--ca-file")),
        (None, Some(f)) => Some((PathBuf::from(f), "RTGT_CA_FILE")),
        (None, None) => None,
    };
    if let Endpoint::Https(_) = endpoint {
        notes.push(match &ca_file {
            Some((f, why)) => format!("trusting the certificates in {} ({why})", f.display()),
            None => format!("trusting the system's CA certificates ({SYSTEM_CA_FILE})"),
        });
    }
    Ok(Found {
        endpoint,
        token,
        ca_file: ca_file.map(|(f, _)| f),
        notes,
    })
}

/// Largest response body accepted.
const MAX_REPLY: usize = 64 << 20;

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
        assert_eq!(
            Client::url("https://x:1").unwrap().endpoint,
            Endpoint::Https("x:1".into())
        );
        assert_eq!(
            Client::url("https://[::1]:8443/api").unwrap().endpoint,
            Endpoint::Https("[::1]:8443".into())
        );
        for bad in [
            "ftp://x:1",
            "http://x",
            "https://:1",
            "http://[::1]",
            "http://x:y",
        ] {
            assert!(Client::url(bad).is_err(), "{bad}");
        }
        for (a, lo) in [
            ("127.0.0.1:8080", true),
            ("127.1.2.3:1", true),
            ("[::1]:8080", true),
            ("localhost:8080", true),
            ("LOCALHOST:1", true),
            ("192.0.2.1:8080", false),
            ("[fd00::1]:8080", false),
            ("example.com:80", false),
        ] {
            assert_eq!(is_loopback(a), lo, "{a}");
        }
        assert_eq!(segment("iqn.2025-01.io.rtgt:t"), "iqn.2025-01.io.rtgt:t");
        assert_eq!(segment("[::1]:3260"), "%5B::1%5D:3260");
    }

    /// An environment and file system made up for a test.
    #[derive(Default)]
    struct Fake {
        env: Vec<(&'static str, &'static str)>,
        present: Vec<&'static str>,
        files: Vec<(&'static str, &'static str)>,
    }

    impl Probe for Fake {
        fn env(&self, name: &str) -> Option<String> {
            self.env
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
        fn exists(&self, path: &Path) -> bool {
            self.present.iter().any(|p| Path::new(p) == path)
                || self.files.iter().any(|(p, _)| Path::new(p) == path)
        }
        fn read(&self, path: &Path) -> io::Result<String> {
            self.files
                .iter()
                .find(|(p, _)| Path::new(p) == path)
                .map(|(_, t)| t.to_string())
                .ok_or_else(|| io::Error::from(io::ErrorKind::PermissionDenied))
        }
    }

    fn unix(p: &str) -> Endpoint {
        Endpoint::Unix(p.into())
    }

    #[test]
    fn discovery_order_of_the_endpoint() {
        let all = Fake {
            env: vec![("RTGT_SOCKET", "/env.sock")],
            present: vec![LOCAL_SOCKET, RUN_SOCKET, LEGACY_SOCKET],
            ..Fake::default()
        };
        let flags = Given {
            socket: Some("/flag.sock".into()),
            ..Given::default()
        };
        let f = discover(&flags, &all).unwrap();
        assert_eq!(f.endpoint, unix("/flag.sock"));
        assert_eq!(f.notes, ["API at unix socket /flag.sock (--socket)"]);
        let url = Given {
            url: Some("http://192.0.2.1:8080".into()),
            ..Given::default()
        };
        assert_eq!(
            discover(&url, &all).unwrap().endpoint,
            Endpoint::Tcp("192.0.2.1:8080".into())
        );
        let none = Given::default();
        let f = discover(&none, &all).unwrap();
        assert_eq!(f.endpoint, unix("/env.sock"));
        assert_eq!(f.notes[0], "API at unix socket /env.sock (RTGT_SOCKET)");
        let env_url = Fake {
            env: vec![("RTGT_URL", "https://[::1]:8443")],
            ..Fake::default()
        };
        assert_eq!(
            discover(&none, &env_url).unwrap().endpoint,
            Endpoint::Https("[::1]:8443".into())
        );
        let both = Fake {
            env: vec![("RTGT_URL", "http://h:1"), ("RTGT_SOCKET", "/s")],
            ..Fake::default()
        };
        assert!(matches!(
            discover(&none, &both),
            Err(ClientError::Setup(m)) if m.contains("both set")
        ));
        // Flags settle it.
        assert_eq!(
            discover(&flags, &both).unwrap().endpoint,
            unix("/flag.sock")
        );
        let bad = Fake {
            env: vec![("RTGT_URL", "localhost:8080")],
            ..Fake::default()
        };
        assert!(matches!(discover(&none, &bad), Err(ClientError::Url(_))));
        // The sockets, in order, where they exist.
        let f = discover(
            &none,
            &Fake {
                present: vec![LOCAL_SOCKET, RUN_SOCKET],
                ..Fake::default()
            },
        )
        .unwrap();
        assert_eq!(f.endpoint, unix(LOCAL_SOCKET));
        assert_eq!(
            f.notes,
            ["API at unix socket ./rtgt-state/rtgtd.sock (found in the working directory)"]
        );
        let f = discover(
            &none,
            &Fake {
                present: vec![RUN_SOCKET, LEGACY_SOCKET],
                ..Fake::default()
            },
        )
        .unwrap();
        assert_eq!(f.endpoint, unix(RUN_SOCKET));
        let f = discover(
            &none,
            &Fake {
                present: vec![LEGACY_SOCKET],
                ..Fake::default()
            },
        )
        .unwrap();
        assert_eq!(f.endpoint, unix(LEGACY_SOCKET));
        assert!(f.token.is_none());
        match discover(&none, &Fake::default()) {
            Err(ClientError::Setup(m)) => {
                for p in [LOCAL_SOCKET, RUN_SOCKET, LEGACY_SOCKET, "--socket", "--url"] {
                    assert!(m.contains(p), "{m}");
                }
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn discovery_of_the_token() {
        let loopback = Given {
            url: Some("http://127.0.0.1:8080".into()),
            ..Given::default()
        };
        let files = Fake {
            files: vec![
                ("./rtgt-state/api-token", "local-token\n"),
                ("/var/lib/rtgt/api-token", "system-token\n"),
                ("/my-token", " mine \n"),
                ("/empty", "\n"),
            ],
            ..Fake::default()
        };
        let f = discover(&loopback, &files).unwrap();
        assert_eq!(f.token.as_deref(), Some("local-token"));
        assert_eq!(f.notes[1], "token from ./rtgt-state/api-token");
        assert!(f.notes.iter().all(|n| !n.contains("local-token")));
        // An unreadable file is skipped; none readable is no token, not an error.
        let system = Fake {
            files: vec![("/var/lib/rtgt/api-token", "system-token")],
            ..Fake::default()
        };
        let f = discover(&loopback, &system).unwrap();
        assert_eq!(f.token.as_deref(), Some("system-token"));
        assert_eq!(f.notes[1], "token from /var/lib/rtgt/api-token");
        let f = discover(&loopback, &Fake::default()).unwrap();
        assert_eq!(f.token, None);
        assert!(f.notes[1].starts_with("no token"), "{:?}", f.notes);
        // Not on loopback: no token file is guessed.
        let remote = Given {
            url: Some("http://192.0.2.1:8080".into()),
            ..Given::default()
        };
        assert_eq!(discover(&remote, &files).unwrap().token, None);
        // Nor for the unix socket.
        let sock = Given {
            socket: Some("/s".into()),
            ..Given::default()
        };
        assert_eq!(discover(&sock, &files).unwrap().token, None);
        // Given ones come first: flags, then the environment.
        let with = |g: Given, env: Vec<(&'static str, &'static str)>| {
            let probe = Fake {
                env,
                files: files.files.clone(),
                ..Fake::default()
            };
            discover(&g, &probe).map(|f| (f.token, f.notes))
        };
        let (t, notes) = with(
            Given {
                token: Some("flag".into()),
                ..loopback.clone()
            },
            vec![("RTGT_TOKEN", "env")],
        )
        .unwrap();
        assert_eq!(t.as_deref(), Some("flag"));
        assert_eq!(notes[1], "token from --token");
        let (t, notes) = with(
            Given {
                token_file: Some("/my-token".into()),
                ..remote.clone()
            },
            vec![("RTGT_TOKEN", "env")],
        )
        .unwrap();
        assert_eq!(t.as_deref(), Some("mine"));
        assert_eq!(notes[1], "token from /my-token (--token-file)");
        let (t, _) = with(
            loopback.clone(),
            vec![("RTGT_TOKEN", "env"), ("RTGT_TOKEN_FILE", "/my-token")],
        )
        .unwrap();
        assert_eq!(t.as_deref(), Some("env"));
        let (t, notes) = with(remote.clone(), vec![("RTGT_TOKEN_FILE", "/my-token")]).unwrap();
        assert_eq!(t.as_deref(), Some("mine"));
        assert_eq!(notes[1], "token from /my-token (RTGT_TOKEN_FILE)");
        // A token file asked for must be readable and hold a token.
        for f in ["/missing", "/empty"] {
            let g = Given {
                token_file: Some(f.into()),
                ..loopback.clone()
            };
            assert!(matches!(with(g, vec![]), Err(ClientError::Setup(m)) if m.contains(f)));
        }
    }

    #[test]
    fn discovery_of_the_ca_file() {
        let https = Given {
            url: Some("https://192.0.2.1:8443".into()),
            ..Given::default()
        };
        let f = discover(&https, &Fake::default()).unwrap();
        assert_eq!(f.ca_file, None);
        assert!(f.notes[2].contains(SYSTEM_CA_FILE), "{:?}", f.notes);
        let env = Fake {
            env: vec![("RTGT_CA_FILE", "/env-ca.pem")],
            ..Fake::default()
        };
        let f = discover(&https, &env).unwrap();
        assert_eq!(f.ca_file, Some("/env-ca.pem".into()));
        assert_eq!(
            f.notes[2],
            "trusting the certificates in /env-ca.pem (RTGT_CA_FILE)"
        );
        let flag = Given {
            ca_file: Some("/ca.pem".into()),
            ..https
        };
        assert_eq!(
            discover(&flag, &env).unwrap().ca_file,
            Some("/ca.pem".into())
        );
    }

    /// A TLS server on 127.0.0.1 answering one request per connection with `body`.
    fn tls_server(
        cert: CertificateDer<'static>,
        key: rustls::pki_types::PrivateKeyDer<'static>,
        body: &'static str,
    ) -> u16 {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = Arc::new(
            rustls::ServerConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(vec![cert], key)
                .unwrap(),
        );
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(s) = s else { continue };
                let conn = rustls::ServerConnection::new(config.clone()).unwrap();
                let mut tls = rustls::StreamOwned::new(conn, s);
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    match tls.read(&mut byte) {
                        Ok(1) => head.push(byte[0]),
                        _ => break,
                    }
                }
                if !head.ends_with(b"\r\n\r\n") {
                    continue;
                }
                let _ = write!(
                    tls,
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                );
                tls.conn.send_close_notify();
                let _ = tls.flush();
            }
        });
        port
    }

    #[test]
    fn https_with_and_without_the_ca() {
        let ck = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
        let cert = CertificateDer::from(ck.cert.der().to_vec());
        let key = rustls::pki_types::PrivateKeyDer::try_from(ck.key_pair.serialize_der()).unwrap();
        let port = tls_server(cert, key, r#"{"status":"ok"}"#);
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, ck.cert.pem()).unwrap();
        let url = format!("https://127.0.0.1:{port}");
        let c = Client::url(&url).unwrap().with_ca_file(&ca).unwrap();
        let v: serde_json::Value = c.get("/api/v1/health").unwrap();
        assert_eq!(v["status"], "ok");
        // Without the certificate (the system's CA certificates, or none) it is refused.
        match Client::url(&url).unwrap().get_text("/api/v1/health") {
            Err(e @ ClientError::Tls { .. }) => {
                assert!(e.to_string().contains("--ca-file"), "{e}");
            }
            other => panic!("expected a TLS error, got {other:?}"),
        }
        // Another certificate is no better.
        let other = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
        let other_ca = dir.path().join("other.pem");
        std::fs::write(&other_ca, other.cert.pem()).unwrap();
        let e = Client::url(&url)
            .unwrap()
            .with_ca_file(&other_ca)
            .unwrap()
            .get_text("/")
            .unwrap_err();
        assert!(
            matches!(&e, ClientError::Tls { message, .. } if message.contains("not trusted")),
            "{e}"
        );
        // A CA file that holds no certificate is refused at once.
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a certificate\n").unwrap();
        assert!(matches!(
            Client::url(&url).unwrap().with_ca_file(&junk),
            Err(ClientError::Setup(m)) if m.contains("junk.pem")
        ));
    }
}
