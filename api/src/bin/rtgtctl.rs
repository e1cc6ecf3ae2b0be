//! rtgtctl: the command line over rtgtd's administration API.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use rtgt_api::client::{discover, segment, ClientError, Given, System};
use rtgt_api::config::{
    Acl, Auth, Backstore, BackstoreKind, ByteSize, Chap, Config, Lun, MappedLun, Port, PortalGroup,
    RbdImage, SrpAcl, SrpPort, Target, REDACTED,
};
use rtgt_api::nvme::{Nvme, NvmeNamespace, NvmePort, NvmeSubsystem, NvmeTransport};
use rtgt_api::resource::PortPath;
use rtgt_api::server::Portal;
use rtgt_api::{AluaView, ChangeReport, SessionView};

/// Manages a running rtgtd: backstores, targets, LUNs, ACLs, sessions and the whole
/// configuration.
#[derive(Parser, Debug)]
#[command(
    name = "rtgtctl",
    version,
    after_help = "Finding rtgtd: --socket or --url; else RTGT_SOCKET or RTGT_URL; else the \
        first socket present of ./rtgt-state/rtgtd.sock (rtgtd started in this directory), \
        /run/rtgt/rtgtd.sock (the service) and /var/lib/rtgt/rtgtd.sock. A TCP API takes \
        the token of --token, --token-file, RTGT_TOKEN or RTGT_TOKEN_FILE; on a loopback \
        address rtgtctl reads ./rtgt-state/api-token or /var/lib/rtgt/api-token when it \
        may. -v tells which it used."
)]
struct Args {
    /// The API's unix socket [env: RTGT_SOCKET].
    #[arg(long, global = true, conflicts_with = "url")]
    socket: Option<PathBuf>,
    /// The API over TCP instead: http://HOST:PORT or https://HOST:PORT [env: RTGT_URL].
    #[arg(long, global = true)]
    url: Option<String>,
    /// Bearer token for a TCP API [env: RTGT_TOKEN].
    #[arg(long, global = true, conflicts_with = "token_file")]
    token: Option<String>,
    /// File holding the bearer token [env: RTGT_TOKEN_FILE].
    #[arg(long, global = true)]
    token_file: Option<PathBuf>,
    /// CA certificates (PEM) for an https URL; for a self-signed certificate, the
    /// certificate itself. Default: the system's [env: RTGT_CA_FILE].
    #[arg(long, global = true)]
    ca_file: Option<PathBuf>,
    /// Tell on standard error where the API was found and whence the token came.
    #[arg(long, short, global = true)]
    verbose: bool,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Backstores.
    #[command(subcommand)]
    Backstores(BackstoreCmd),
    /// Targets.
    #[command(subcommand)]
    Targets(TargetCmd),
    /// Portals of a portal group.
    #[command(subcommand)]
    Portals(PortalCmd),
    /// LUNs of a portal group.
    #[command(subcommand)]
    Luns(LunCmd),
    /// ACLs of a portal group.
    #[command(subcommand)]
    Acls(AclCmd),
    /// SRP target ports, their LUNs and ACLs.
    #[command(subcommand)]
    Srp(SrpCmd),
    /// Sessions of every transport (iSCSI over TCP, iSER, SRP).
    #[command(subcommand)]
    Sessions(SessionCmd),
    /// ALUA target port groups and their access states.
    #[command(subcommand)]
    Alua(AluaCmd),
    /// NVMe over Fabrics subsystems, their namespaces and hosts, and ports.
    #[command(subcommand)]
    Nvme(NvmeCmd),
    /// Applies a configuration document (YAML or JSON): only what differs changes.
    Apply {
        /// The document; `-` reads standard input.
        #[arg(conflicts_with = "filename", required_unless_present = "filename")]
        file: Option<PathBuf>,
        /// The document, as `-f FILE` or `-f -` (standard input).
        #[arg(short = 'f', long = "filename", value_name = "FILE")]
        filename: Option<PathBuf>,
        /// Print what would change, changing nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Prints the running configuration as YAML.
    Export {
        /// Include CHAP secrets (otherwise shown as `********`).
        #[arg(long)]
        secrets: bool,
    },
    /// Converts a targetcli saveconfig.json into an rtgt configuration (offline).
    ImportLio {
        file: PathBuf,
        /// Write the result here (mode 0600, CHAP secrets included) instead of standard
        /// output.
        #[arg(long, short)]
        output: Option<PathBuf>,
        /// Print CHAP secrets on standard output instead of `********`.
        #[arg(long)]
        secrets: bool,
    },
    /// Prints the Prometheus metrics.
    Metrics,
    /// Checks that rtgtd answers and every portal listens.
    Status,
}

#[derive(Subcommand, Debug)]
enum BackstoreCmd {
    List,
    Show {
        name: String,
    },
    Create {
        name: String,
        /// file, block, ramdisk, null or rbd.
        #[arg(long = "type", value_parser = parse_kind)]
        kind: BackstoreKind,
        /// rbd: the image, as `[POOL/[NAMESPACE/]]IMAGE` (pool `rbd` by default).
        #[arg(long, value_name = "IMAGE_SPEC")]
        image: Option<String>,
        /// rbd: the cluster's configuration file (default /etc/ceph/ceph.conf).
        #[arg(long)]
        ceph_conf: Option<PathBuf>,
        /// rbd: the Ceph client name without `client.` (default admin).
        #[arg(long)]
        client_id: Option<String>,
        /// rbd: a keyring other than the configuration's.
        #[arg(long)]
        keyring: Option<PathBuf>,
        #[arg(long)]
        path: Option<PathBuf>,
        #[arg(long, value_parser = ByteSize::parse)]
        size: Option<ByteSize>,
        #[arg(long, default_value_t = 512)]
        block_size: u32,
        #[arg(long)]
        read_only: bool,
        /// File and block: bypass the page cache with O_DIRECT (true) or serve through it
        /// (false). Default: false for a file, true for a block device.
        #[arg(long, value_name = "BOOL", action = clap::ArgAction::Set)]
        direct: Option<bool>,
        /// Report a volatile write cache (WCE=1): writes are durable after SYNCHRONIZE
        /// CACHE or with FUA. With false every write is durable on completion.
        #[arg(long, value_name = "BOOL", action = clap::ArgAction::Set, default_value_t = true)]
        write_cache: bool,
    },
    /// Changes the cache modes, live on a LUN in use (see the README's cache modes).
    Cache {
        name: String,
        /// Bypass the page cache with O_DIRECT (true) or serve through it (false).
        #[arg(long, value_name = "BOOL", action = clap::ArgAction::Set)]
        direct: Option<bool>,
        /// The volatile write cache (WCE); turning it off flushes what was cached.
        #[arg(long, value_name = "BOOL", action = clap::ArgAction::Set)]
        write_cache: Option<bool>,
    },
    /// Changes the size (initiators get CAPACITY DATA HAS CHANGED).
    Resize {
        name: String,
        #[arg(value_parser = ByteSize::parse)]
        size: ByteSize,
    },
    Delete {
        name: String,
    },
}

#[derive(Subcommand, Debug)]
enum TargetCmd {
    List,
    Show {
        name: String,
    },
    /// Creates a target with portal group 1.
    Create {
        name: String,
        /// Portal address:port (repeatable).
        #[arg(long = "portal", default_value = "0.0.0.0:3260")]
        portals: Vec<std::net::SocketAddr>,
        /// Admit any initiator (no ACLs needed).
        #[arg(long)]
        allow_any_initiator: bool,
        /// Target port group of portal group 1 (required when ALUA groups are configured).
        #[arg(long)]
        alua_group: Option<u16>,
    },
    Delete {
        name: String,
    },
}

#[derive(clap::Args, Debug)]
struct Tpg {
    target: String,
    /// Portal group tag.
    #[arg(long, default_value_t = 1)]
    tpg: u16,
}

impl Tpg {
    fn port(&self) -> PortPath<PortalGroup> {
        PortPath::new(&self.target, &self.tpg)
    }
}

#[derive(Subcommand, Debug)]
enum PortalCmd {
    List {
        #[command(flatten)]
        tpg: Tpg,
    },
    Add {
        #[command(flatten)]
        tpg: Tpg,
        address: std::net::SocketAddr,
    },
    Remove {
        #[command(flatten)]
        tpg: Tpg,
        address: std::net::SocketAddr,
    },
}

#[derive(Subcommand, Debug)]
enum LunCmd {
    List {
        #[command(flatten)]
        tpg: Tpg,
    },
    /// Maps a backstore (sessions get REPORTED LUNS DATA HAS CHANGED).
    Add {
        #[command(flatten)]
        tpg: Tpg,
        lun: u64,
        backstore: String,
    },
    Remove {
        #[command(flatten)]
        tpg: Tpg,
        lun: u64,
    },
}

#[derive(Subcommand, Debug)]
enum AclCmd {
    List {
        #[command(flatten)]
        tpg: Tpg,
    },
    Add {
        #[command(flatten)]
        tpg: Tpg,
        initiator: String,
        /// CHAP user the initiator must log in with.
        #[arg(long, requires = "chap_secret")]
        chap_user: Option<String>,
        /// CHAP secret (12 to 255 characters).
        #[arg(long, requires = "chap_user")]
        chap_secret: Option<String>,
        /// Map a portal group LUN: INITIATOR_LUN=TPG_LUN (repeatable; default: all LUNs).
        #[arg(long = "map", value_parser = parse_map)]
        maps: Vec<MappedLun>,
    },
    /// Removes the ACL and ends that initiator's sessions.
    Remove {
        #[command(flatten)]
        tpg: Tpg,
        initiator: String,
    },
}

#[derive(Subcommand, Debug)]
enum SrpCmd {
    List,
    Show {
        name: String,
    },
    /// Creates an SRP target port (its RDMA/CM listeners start at once).
    Create {
        name: String,
        /// RDMA/CM listen address:port (repeatable).
        #[arg(long = "listen", default_value = "0.0.0.0:5555")]
        listen: Vec<std::net::SocketAddr>,
        /// Identifier extension (16 hex digits); derived from the host and name when absent.
        #[arg(long)]
        id_ext: Option<String>,
        /// I/O controller GUID (16 hex digits); derived like --id-ext.
        #[arg(long)]
        ioc_guid: Option<String>,
        /// Admit any initiator (no ACLs needed).
        #[arg(long)]
        allow_any_initiator: bool,
        /// Target port group (required when ALUA groups are configured).
        #[arg(long)]
        alua_group: Option<u16>,
    },
    /// Deletes the port: its channels get SRP_T_LOGOUT.
    Delete {
        name: String,
    },
    /// Maps a backstore as a LUN of the port (sessions get REPORTED LUNS DATA HAS CHANGED).
    AddLun {
        name: String,
        lun: u64,
        backstore: String,
    },
    RemoveLun {
        name: String,
        lun: u64,
    },
    /// Admits an initiator port (0x and 32 hex digits).
    AddAcl {
        name: String,
        initiator: String,
        /// Map a port LUN: INITIATOR_LUN=PORT_LUN (repeatable; default: all LUNs).
        #[arg(long = "map", value_parser = parse_map)]
        maps: Vec<MappedLun>,
    },
    /// Removes the ACL and logs out that initiator's channels.
    RemoveAcl {
        name: String,
        initiator: String,
    },
}

fn srp_port(name: &str) -> PortPath<SrpPort> {
    PortPath::new(&(), &name.to_string())
}

fn print_srp_ports(json: bool, v: &[SrpPort]) {
    print_list(
        json,
        v,
        &["PORT", "LISTEN", "ID_EXT", "IOC_GUID", "LUNS", "ACLS"],
        |p| {
            vec![
                p.name.clone(),
                joined(&p.listen, |a| a.to_string()),
                p.id_ext.clone().unwrap_or_else(|| "derived".into()),
                p.ioc_guid.clone().unwrap_or_else(|| "derived".into()),
                joined(&p.luns, |l| format!("{}={}", l.lun, l.backstore)),
                acls_cell(p),
            ]
        },
    );
}

/// The items of a list cell, comma-separated.
fn joined<T>(items: &[T], cell: impl Fn(&T) -> String) -> String {
    items.iter().map(cell).collect::<Vec<_>>().join(",")
}

/// Who a port admits: `any`, or how many ACLs it has.
fn acls_cell(p: &impl Port) -> String {
    if p.allow_any_initiator() {
        "any".into()
    } else {
        p.acls().len().to_string()
    }
}

#[derive(Subcommand, Debug)]
enum SessionCmd {
    /// iSCSI, iSER and SRP sessions and NVMe controllers (with their queues).
    List,
    /// One session; an NVMe controller with each of its queues.
    Show { id: String },
    /// Ends a session at once (an NVMe controller: every queue's connection closes).
    Logout { id: String },
}

#[derive(Subcommand, Debug)]
enum AluaCmd {
    /// Every LUN's target port groups with their states now.
    Show,
    /// Sets a group's access state, for all its LUNs or one backstore's (a failover).
    Set {
        /// Target port group.
        group: u16,
        /// active_optimized, active_non_optimized, standby, unavailable, offline or
        /// transitioning.
        state: String,
        /// Only this backstore's LUNs.
        #[arg(long)]
        backstore: Option<String>,
        /// PREF: whether hosts should prefer the group.
        #[arg(long)]
        preferred: Option<bool>,
    },
}

#[derive(Subcommand, Debug)]
enum NvmeCmd {
    /// The subsystems with their namespaces and hosts, and the ports.
    List,
    /// One subsystem.
    Show {
        nqn: String,
    },
    /// Creates a subsystem (any host admitted unless --host is given).
    Create {
        nqn: String,
        /// A host NQN to admit (repeatable).
        #[arg(long = "host")]
        hosts: Vec<String>,
        /// Serial number (1 to 20 characters); derived from the host and NQN when absent.
        #[arg(long)]
        serial: Option<String>,
    },
    /// Deletes a subsystem: its controllers close.
    Delete {
        nqn: String,
    },
    /// Adds a namespace on a backstore (hosts hear of it).
    AddNamespace {
        nqn: String,
        nsid: u32,
        backstore: String,
        /// The backstore is a SCSI LUN too.
        #[arg(long)]
        share_with_scsi: bool,
    },
    RemoveNamespace {
        nqn: String,
        nsid: u32,
    },
    /// Admits a host NQN (a subsystem that admitted any host then admits only those listed).
    AddHost {
        nqn: String,
        host: String,
    },
    /// No longer admits a host: its controllers close.
    RemoveHost {
        nqn: String,
        host: String,
    },
    /// Adds a port (every port serves every subsystem).
    AddPort {
        id: u16,
        /// Address and port, e.g. 0.0.0.0:4420.
        listen: std::net::SocketAddr,
        /// tcp or rdma.
        #[arg(long, default_value = "tcp", value_parser = parse_nvme_transport)]
        transport: NvmeTransport,
        /// Target port group: namespaces report its access state as their ANA state.
        #[arg(long)]
        alua_group: Option<u16>,
        /// Bytes an I/O command may carry in its capsule (multiple of 16; TCP: 128 KiB
        /// when not given, RDMA: 8 KiB).
        #[arg(long)]
        in_capsule_data_size: Option<u32>,
    },
    /// Removes a port: its listener stops.
    RemovePort {
        id: u16,
    },
}

fn parse_nvme_transport(s: &str) -> Result<NvmeTransport, String> {
    match s {
        "tcp" => Ok(NvmeTransport::Tcp),
        "rdma" => Ok(NvmeTransport::Rdma),
        _ => Err(format!("{s:?}: expected tcp or rdma")),
    }
}

fn print_subsystems(json: bool, v: &[NvmeSubsystem]) {
    print_list(json, v, &["NQN", "NAMESPACES", "HOSTS"], |s| {
        vec![
            s.nqn.clone(),
            joined(&s.namespaces, |n| format!("{}={}", n.nsid, n.backstore)),
            if s.allow_any_host {
                "any".into()
            } else {
                joined(&s.hosts, |h| h.clone())
            },
        ]
    });
}

fn print_nvme_ports(json: bool, v: &[NvmePort]) {
    print_list(
        json,
        v,
        &["PORT", "TRANSPORT", "LISTEN", "ALUA_GROUP", "IN_CAPSULE"],
        |p| {
            vec![
                p.id.to_string(),
                p.transport.name().into(),
                p.listen.to_string(),
                p.alua_group.map_or_else(|| "-".into(), |g| g.to_string()),
                p.in_capsule().to_string(),
            ]
        },
    );
}

fn subsystem_path(nqn: &str) -> String {
    format!("/api/v1/nvme/subsystems/{}", segment(nqn))
}

fn parse_kind(s: &str) -> Result<BackstoreKind, String> {
    match s {
        "file" => Ok(BackstoreKind::File),
        "block" => Ok(BackstoreKind::Block),
        "ramdisk" => Ok(BackstoreKind::Ramdisk),
        "null" => Ok(BackstoreKind::Null),
        "rbd" => Ok(BackstoreKind::Rbd),
        _ => Err(format!("{s:?}: expected file, block, ramdisk, null or rbd")),
    }
}

/// The `rbd` section from `--image [POOL/[NAMESPACE/]]IMAGE` and the cluster options.
fn rbd_image(
    spec: Option<&str>,
    ceph_conf: Option<PathBuf>,
    client_id: Option<String>,
    keyring: Option<PathBuf>,
) -> Result<Option<RbdImage>, ClientError> {
    let Some(spec) = spec else {
        if ceph_conf.is_some() || client_id.is_some() || keyring.is_some() {
            return Err(ClientError::Setup(
                "--ceph-conf, --client-id and --keyring go with --image".into(),
            ));
        }
        return Ok(None);
    };
    let parts: Vec<&str> = spec.split('/').collect();
    let (pool, namespace, image) = match parts[..] {
        [image] => ("rbd", "", image),
        [pool, image] => (pool, "", image),
        [pool, namespace, image] => (pool, namespace, image),
        _ => {
            return Err(ClientError::Setup(format!(
                "--image {spec:?}: expected [POOL/[NAMESPACE/]]IMAGE"
            )))
        }
    };
    let mut r: RbdImage = serde_json::from_value(serde_json::json!({
        "pool": pool, "namespace": namespace, "image": image,
    }))?;
    if let Some(c) = ceph_conf {
        r.ceph_conf = c;
    }
    if let Some(c) = client_id {
        r.client_id = c;
    }
    r.keyring = keyring;
    Ok(Some(r))
}

fn parse_map(s: &str) -> Result<MappedLun, String> {
    let (a, b) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected INITIATOR_LUN=TPG_LUN"))?;
    Ok(MappedLun {
        lun: a
            .trim()
            .parse()
            .map_err(|_| format!("{a:?} is not a LUN"))?,
        tpg_lun: b
            .trim()
            .parse()
            .map_err(|_| format!("{b:?} is not a LUN"))?,
    })
}

/// Prints rows as aligned columns.
fn table(header: &[&str], rows: Vec<Vec<String>>) {
    let mut w: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.len());
        }
    }
    let line = |cells: Vec<String>| {
        let s: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<width$}", width = w[i]))
            .collect();
        println!("{}", s.join("  ").trim_end());
    };
    line(header.iter().map(|s| s.to_string()).collect());
    for r in rows {
        line(r);
    }
}

/// Prints `v` as JSON, or as a table of `header` with a row per item.
fn print_list<T: serde::Serialize>(
    json: bool,
    v: &[T],
    header: &[&str],
    row: impl Fn(&T) -> Vec<String>,
) {
    if json {
        return print_json(&v);
    }
    table(header, v.iter().map(row).collect());
}

fn print_sessions(json: bool, v: &[SessionView]) {
    let header = [
        "ID",
        "INITIATOR",
        "TARGET",
        "TRANSPORT",
        "PEER",
        "QUEUES",
        "QD",
        "OUT",
        "COMMANDS",
        "UPTIME",
    ];
    print_list(json, v, &header, |s| {
        vec![
            s.id.clone(),
            s.initiator.clone(),
            s.target.clone(),
            s.transport.clone(),
            s.peer.clone(),
            s.queues.map_or("-".into(), |q| q.to_string()),
            s.queue_depth.to_string(),
            s.outstanding.to_string(),
            s.commands.to_string(),
            format!("{}s", s.uptime_seconds),
        ]
    });
}

fn print_json<T: serde::Serialize>(v: &T) {
    println!(
        "{}",
        serde_json::to_string_pretty(v).unwrap_or_else(|_| "null".into())
    );
}

fn print_report(json: bool, r: &ChangeReport) {
    if json {
        return print_json(r);
    }
    if r.changes.is_empty() {
        println!("no changes");
    }
    for c in &r.changes {
        match &c.detail {
            Some(d) => println!("{} {} {} ({d})", c.action, c.object, c.name),
            None => println!("{} {} {}", c.action, c.object, c.name),
        }
    }
}

fn backstore_row(b: &Backstore) -> Vec<String> {
    vec![
        b.name.clone(),
        format!("{:?}", b.kind).to_lowercase(),
        b.size.map(|s| s.to_string()).unwrap_or_else(|| "-".into()),
        b.block_size.to_string(),
        match (&b.path, &b.rbd) {
            (Some(p), _) => p.display().to_string(),
            (None, Some(r)) if r.namespace.is_empty() => format!("rbd:{}/{}", r.pool, r.image),
            (None, Some(r)) => format!("rbd:{}/{}/{}", r.pool, r.namespace, r.image),
            (None, None) => "-".into(),
        },
        if b.read_only { "ro" } else { "rw" }.into(),
        match b.kind {
            BackstoreKind::File | BackstoreKind::Block if b.direct() => "direct",
            BackstoreKind::File | BackstoreKind::Block => "page",
            BackstoreKind::Ramdisk | BackstoreKind::Null | BackstoreKind::Rbd => "-",
        }
        .into(),
        if b.write_cache { "on" } else { "off" }.into(),
    ]
}

fn print_backstores(json: bool, v: &[Backstore]) {
    print_list(
        json,
        v,
        &[
            "NAME",
            "TYPE",
            "SIZE",
            "BLOCK",
            "PATH",
            "MODE",
            "CACHE",
            "WRITE-CACHE",
        ],
        backstore_row,
    );
}

fn print_targets(json: bool, v: &[Target]) {
    if json {
        return print_json(&v);
    }
    let mut rows = Vec::new();
    for t in v {
        for g in &t.portal_groups {
            rows.push(vec![
                t.name.clone(),
                g.tag.to_string(),
                joined(&g.portals, |p| p.to_string()),
                g.luns.len().to_string(),
                acls_cell(g),
                if g.auth.chap.is_some() {
                    "chap"
                } else {
                    "none"
                }
                .into(),
            ]);
        }
    }
    table(&["TARGET", "TPG", "PORTALS", "LUNS", "ACLS", "AUTH"], rows);
}

/// What error messages must not show, and whether a token went with the request.
#[derive(Default)]
struct Context {
    secrets: Vec<String>,
    token: bool,
}

impl Context {
    /// `text` with every secret this run handled replaced by `********`.
    fn scrub(&self, text: &str) -> String {
        let mut t = text.to_string();
        for s in self.secrets.iter().filter(|s| s.len() >= 6) {
            t = t.replace(s.as_str(), REDACTED);
        }
        t
    }
}

/// The CHAP secrets a configuration document holds (as far as it parses).
fn document_secrets(text: &str) -> Vec<String> {
    fn walk(v: &serde_norway::Value, out: &mut Vec<String>) {
        use serde_norway::Value;
        match v {
            Value::Mapping(m) => {
                for (k, v) in m {
                    match (k.as_str(), v) {
                        (Some("secret"), Value::String(s)) => out.push(s.clone()),
                        (Some("secret"), Value::Number(n)) => out.push(n.to_string()),
                        _ => walk(v, out),
                    }
                }
            }
            Value::Sequence(s) => s.iter().for_each(|v| walk(v, out)),
            Value::Tagged(t) => walk(&t.value, out),
            _ => {}
        }
    }
    let mut out = Vec::new();
    if let Ok(v) = serde_norway::from_str::<serde_norway::Value>(text) {
        walk(&v, &mut out);
    }
    out.retain(|s| s != REDACTED);
    out
}

/// Reads a document from a file, or from standard input for `-`.
fn read_document(path: &Path) -> Result<String, ClientError> {
    let mut text = String::new();
    let read = if path.as_os_str() == "-" {
        std::io::stdin().read_to_string(&mut text).map(|_| ())
    } else {
        std::fs::read_to_string(path).map(|t| text = t)
    };
    read.map_err(|e| {
        let what = if path.as_os_str() == "-" {
            "standard input".to_string()
        } else {
            path.display().to_string()
        };
        ClientError::Setup(format!("cannot read {what}: {e}"))
    })?;
    Ok(text)
}

fn print_dry_run(json: bool, r: &ChangeReport) {
    if json {
        print_json(r);
        eprintln!("(dry run: nothing changed)");
        return;
    }
    if r.changes.is_empty() {
        println!("no changes");
    } else {
        table(
            &["ACTION", "OBJECT", "NAME", "DETAIL"],
            r.changes
                .iter()
                .map(|c| {
                    vec![
                        c.action.clone(),
                        c.object.clone(),
                        c.name.clone(),
                        c.detail.clone().unwrap_or_default(),
                    ]
                })
                .collect(),
        );
    }
    println!("(dry run: nothing changed)");
}

fn run(args: Args, ctx: &mut Context) -> Result<(), ClientError> {
    let json = args.json;
    if let Cmd::ImportLio {
        file,
        output,
        secrets,
    } = &args.cmd
    {
        let text = std::fs::read_to_string(file)?;
        let import = rtgt_api::lio::convert(&text).map_err(|message| ClientError::Http {
            status: 422,
            message,
            field: None,
        })?;
        for w in &import.warnings {
            eprintln!("warning: {w}");
        }
        match output {
            Some(o) => import
                .config
                .save(o)
                .map_err(|e| ClientError::Io(std::io::Error::other(e.to_string())))?,
            None => {
                let shown = if *secrets {
                    import.config.clone()
                } else {
                    import.config.redacted()
                };
                if shown != import.config {
                    eprintln!(
                        "rtgtctl: CHAP secrets are shown as {REDACTED}: --secrets prints them, -o FILE writes them"
                    );
                }
                print!(
                    "# Converted from {} by rtgtctl import-lio.\n{}",
                    file.display(),
                    shown.to_yaml()
                );
            }
        }
        return Ok(());
    }
    let found = discover(
        &Given {
            socket: args.socket.clone(),
            url: args.url.clone(),
            token: args.token.clone(),
            token_file: args.token_file.clone(),
            ca_file: args.ca_file.clone(),
        },
        &System,
    )?;
    if args.verbose {
        for n in &found.notes {
            eprintln!("rtgtctl: {n}");
        }
    }
    ctx.token = found.token.is_some();
    ctx.secrets.extend(found.token.clone());
    let client = found.client()?;
    let c = &client;
    match args.cmd {
        Cmd::Backstores(cmd) => match cmd {
            BackstoreCmd::List => {
                print_backstores(json, &c.get::<Vec<Backstore>>("/api/v1/backstores")?)
            }
            BackstoreCmd::Show { name } => {
                let b: Backstore = c.get(&format!("/api/v1/backstores/{}", segment(&name)))?;
                print_backstores(json, &[b]);
            }
            BackstoreCmd::Create {
                name,
                kind,
                image,
                ceph_conf,
                client_id,
                keyring,
                path,
                size,
                block_size,
                read_only,
                direct,
                write_cache,
            } => {
                let b = Backstore {
                    name,
                    kind,
                    path,
                    size,
                    block_size,
                    read_only,
                    wwn: None,
                    serial: None,
                    thin: true,
                    write_cache,
                    direct,
                    physical_block_size: None,
                    removable: false,
                    sanitize_rate: None,
                    shared: None,
                    rbd: rbd_image(image.as_deref(), ceph_conf, client_id, keyring)?,
                };
                let v = c.send("POST", "/api/v1/backstores", &b)?;
                let b: Backstore = serde_json::from_value(v)?;
                print_backstores(json, &[b]);
            }
            BackstoreCmd::Cache {
                name,
                direct,
                write_cache,
            } => {
                if direct.is_none() && write_cache.is_none() {
                    return Err(ClientError::Setup(
                        "backstores cache: give --direct, --write-cache or both".into(),
                    ));
                }
                let path = format!("/api/v1/backstores/{}", segment(&name));
                let mut b: Backstore = c.get(&path)?;
                b.direct = direct.or(b.direct);
                b.write_cache = write_cache.unwrap_or(b.write_cache);
                let b: Backstore = serde_json::from_value(c.send("PUT", &path, &b)?)?;
                print_backstores(json, &[b]);
            }
            BackstoreCmd::Resize { name, size } => {
                let path = format!("/api/v1/backstores/{}", segment(&name));
                let mut b: Backstore = c.get(&path)?;
                b.size = Some(size);
                let b: Backstore = serde_json::from_value(c.send("PUT", &path, &b)?)?;
                print_backstores(json, &[b]);
            }
            BackstoreCmd::Delete { name } => {
                c.delete(&format!("/api/v1/backstores/{}", segment(&name)))?
            }
        },
        Cmd::Targets(cmd) => match cmd {
            TargetCmd::List => print_targets(json, &c.get::<Vec<Target>>("/api/v1/targets")?),
            TargetCmd::Show { name } => {
                let t: Target = c.get(&format!("/api/v1/targets/{}", segment(&name)))?;
                let t = Config {
                    targets: vec![t],
                    ..Config::default()
                }
                .redacted()
                .targets
                .remove(0);
                print_object(json, &t);
            }
            TargetCmd::Create {
                name,
                portals,
                allow_any_initiator,
                alua_group,
            } => {
                let t = Target {
                    name,
                    alias: None,
                    portal_groups: vec![PortalGroup {
                        tag: 1,
                        portals,
                        auth: Auth::default(),
                        allow_any_initiator,
                        luns: Vec::new(),
                        acls: Vec::new(),
                        params: Default::default(),
                        iser: true,
                        alua_group,
                        relative_port: None,
                    }],
                };
                let t: Target = serde_json::from_value(c.send("POST", "/api/v1/targets", &t)?)?;
                print_targets(json, &[t]);
            }
            TargetCmd::Delete { name } => {
                c.delete(&format!("/api/v1/targets/{}", segment(&name)))?
            }
        },
        Cmd::Portals(cmd) => match cmd {
            PortalCmd::List { tpg } => {
                let v: Vec<Portal> = c.get(&format!("{}/portals", tpg.port().as_str()))?;
                print_list(json, &v, &["PORTAL"], |p| vec![p.address.to_string()]);
            }
            PortalCmd::Add { tpg, address } => {
                c.send(
                    "POST",
                    &format!("{}/portals", tpg.port().as_str()),
                    &Portal { address },
                )?;
            }
            PortalCmd::Remove { tpg, address } => c.delete(&format!(
                "{}/portals/{}",
                tpg.port().as_str(),
                segment(&address.to_string())
            ))?,
        },
        Cmd::Luns(cmd) => match cmd {
            LunCmd::List { tpg } => {
                print_list(json, &c.luns(&tpg.port())?, &["LUN", "BACKSTORE"], |l| {
                    vec![l.lun.to_string(), l.backstore.clone()]
                });
            }
            LunCmd::Add {
                tpg,
                lun,
                backstore,
            } => c.add_lun(&tpg.port(), &Lun { lun, backstore })?,
            LunCmd::Remove { tpg, lun } => c.remove_lun(&tpg.port(), lun)?,
        },
        Cmd::Acls(cmd) => match cmd {
            AclCmd::List { tpg } => {
                let header = ["INITIATOR", "AUTH", "MAPPED LUNS"];
                print_list(json, &c.acls(&tpg.port())?, &header, |a| {
                    vec![
                        a.initiator.clone(),
                        a.auth
                            .chap
                            .as_ref()
                            .map(|c| format!("chap:{}", c.user))
                            .unwrap_or_else(|| "-".into()),
                        if a.mapped_luns.is_empty() {
                            "all".into()
                        } else {
                            joined(&a.mapped_luns, |m| format!("{}={}", m.lun, m.tpg_lun))
                        },
                    ]
                });
            }
            AclCmd::Add {
                tpg,
                initiator,
                chap_user,
                chap_secret,
                maps,
            } => {
                ctx.secrets.extend(chap_secret.clone());
                let acl = Acl {
                    initiator,
                    auth: Auth {
                        chap: chap_user
                            .zip(chap_secret)
                            .map(|(user, secret)| Chap { user, secret }),
                        mutual_chap: None,
                    },
                    mapped_luns: maps,
                };
                c.add_acl(&tpg.port(), &acl)?;
            }
            AclCmd::Remove { tpg, initiator } => c.remove_acl(&tpg.port(), &initiator)?,
        },
        Cmd::Srp(cmd) => match cmd {
            SrpCmd::List => print_srp_ports(json, &c.ports::<SrpPort>(&())?),
            SrpCmd::Show { name } => {
                let p = c.port(&srp_port(&name))?;
                print_object(json, &p);
            }
            SrpCmd::Create {
                name,
                listen,
                id_ext,
                ioc_guid,
                allow_any_initiator,
                alua_group,
            } => {
                let p = SrpPort {
                    name,
                    listen,
                    id_ext,
                    ioc_guid,
                    allow_any_initiator,
                    luns: Vec::new(),
                    acls: Vec::new(),
                    alua_group,
                    relative_port: None,
                };
                print_srp_ports(json, &[c.create_port(&(), &p)?]);
            }
            SrpCmd::Delete { name } => c.delete_port(&srp_port(&name))?,
            SrpCmd::AddLun {
                name,
                lun,
                backstore,
            } => c.add_lun(&srp_port(&name), &Lun { lun, backstore })?,
            SrpCmd::RemoveLun { name, lun } => c.remove_lun(&srp_port(&name), lun)?,
            SrpCmd::AddAcl {
                name,
                initiator,
                maps,
            } => {
                let acl = SrpAcl {
                    initiator,
                    mapped_luns: maps,
                };
                c.add_acl(&srp_port(&name), &acl)?;
            }
            SrpCmd::RemoveAcl { name, initiator } => c.remove_acl(&srp_port(&name), &initiator)?,
        },
        Cmd::Nvme(cmd) => match cmd {
            NvmeCmd::List => {
                let n: Nvme = c.get("/api/v1/nvme")?;
                if json {
                    print_json(&n);
                } else {
                    print_subsystems(false, &n.subsystems);
                    println!();
                    print_nvme_ports(false, &n.ports);
                }
            }
            NvmeCmd::Show { nqn } => {
                let s: NvmeSubsystem = c.get(&subsystem_path(&nqn))?;
                print_object(json, &s);
            }
            NvmeCmd::Create { nqn, hosts, serial } => {
                let s = NvmeSubsystem {
                    nqn,
                    serial,
                    allow_any_host: hosts.is_empty(),
                    hosts,
                    namespaces: Vec::new(),
                };
                let v = c.send("POST", "/api/v1/nvme/subsystems", &s)?;
                let s: NvmeSubsystem = serde_json::from_value(v)?;
                print_subsystems(json, &[s]);
            }
            NvmeCmd::Delete { nqn } => c.delete(&subsystem_path(&nqn))?,
            NvmeCmd::AddNamespace {
                nqn,
                nsid,
                backstore,
                share_with_scsi,
            } => {
                let n = NvmeNamespace {
                    nsid,
                    backstore,
                    share_with_scsi,
                };
                c.send("POST", &format!("{}/namespaces", subsystem_path(&nqn)), &n)?;
            }
            NvmeCmd::RemoveNamespace { nqn, nsid } => {
                c.delete(&format!("{}/namespaces/{nsid}", subsystem_path(&nqn)))?
            }
            NvmeCmd::AddHost { nqn, host } => {
                let body = serde_json::json!({ "nqn": host });
                c.send("POST", &format!("{}/hosts", subsystem_path(&nqn)), &body)?;
            }
            NvmeCmd::RemoveHost { nqn, host } => c.delete(&format!(
                "{}/hosts/{}",
                subsystem_path(&nqn),
                segment(&host)
            ))?,
            NvmeCmd::AddPort {
                id,
                listen,
                transport,
                alua_group,
                in_capsule_data_size,
            } => {
                let p = NvmePort {
                    id,
                    transport,
                    listen,
                    alua_group,
                    in_capsule_data_size,
                };
                let v = c.send("POST", "/api/v1/nvme/ports", &p)?;
                let p: NvmePort = serde_json::from_value(v)?;
                print_nvme_ports(json, &[p]);
            }
            NvmeCmd::RemovePort { id } => c.delete(&format!("/api/v1/nvme/ports/{id}"))?,
        },
        Cmd::Sessions(cmd) => match cmd {
            SessionCmd::List => {
                let v: Vec<SessionView> = c.get("/api/v1/sessions")?;
                print_sessions(json, &v);
            }
            SessionCmd::Show { id } => {
                let s: SessionView = c.get(&format!("/api/v1/sessions/{}", segment(&id)))?;
                if json {
                    print_json(&s);
                } else {
                    print_sessions(false, std::slice::from_ref(&s));
                    if !s.queue_list.is_empty() {
                        println!();
                        let header = [
                            "QID",
                            "SIZE",
                            "PEER",
                            "OUTSTANDING",
                            "COMMANDS",
                            "BYTES IN",
                            "BYTES OUT",
                        ];
                        print_list(false, &s.queue_list, &header, |q| {
                            vec![
                                q.qid.to_string(),
                                q.size.to_string(),
                                q.peer.clone(),
                                q.outstanding.to_string(),
                                q.commands.to_string(),
                                q.bytes_in.to_string(),
                                q.bytes_out.to_string(),
                            ]
                        });
                    }
                }
            }
            SessionCmd::Logout { id } => c.delete(&format!("/api/v1/sessions/{}", segment(&id)))?,
        },
        Cmd::Alua(cmd) => match cmd {
            AluaCmd::Show => {
                let v: Vec<AluaView> = c.get("/api/v1/alua/states")?;
                let header = ["BACKSTORE", "GROUP", "STATE", "PREF", "PORTS", "CHANGES"];
                print_list(json, &v, &header, |a| {
                    let changes = match (a.implicit, a.explicit) {
                        (true, true) => "implicit, explicit",
                        (true, false) => "implicit",
                        (false, true) => "explicit",
                        (false, false) => "none",
                    };
                    let ports: Vec<String> =
                        a.relative_ports.iter().map(|p| p.to_string()).collect();
                    vec![
                        a.backstore.clone(),
                        a.group.to_string(),
                        a.state.clone(),
                        if a.preferred { "yes" } else { "no" }.into(),
                        ports.join(","),
                        changes.into(),
                    ]
                });
            }
            AluaCmd::Set {
                group,
                state,
                backstore,
                preferred,
            } => {
                let body = serde_json::json!({
                    "state": state,
                    "preferred": preferred,
                    "backstore": backstore,
                });
                let g = c.send("PUT", &format!("/api/v1/alua/groups/{group}/state"), &body)?;
                if json {
                    print_json(&g);
                } else {
                    println!("target port group {group}: {state}");
                }
            }
        },
        Cmd::Apply {
            file,
            filename,
            dry_run,
        } => {
            let path = filename
                .or(file)
                .ok_or_else(|| ClientError::Setup("apply needs a document: FILE or -f -".into()))?;
            let text = read_document(&path)?;
            ctx.secrets.extend(document_secrets(&text));
            if dry_run {
                print_dry_run(json, &c.dry_run_yaml(&text)?);
            } else {
                print_report(json, &c.apply_yaml(&text)?);
            }
        }
        Cmd::Export { secrets } => {
            let cfg: Config = if secrets {
                c.get("/api/v1/config?secrets=true")?
            } else {
                c.get::<Config>("/api/v1/config")?.redacted()
            };
            if json {
                print_json(&cfg);
            } else {
                print!("{}", cfg.to_yaml());
            }
        }
        Cmd::Metrics => print!("{}", c.get_text("/metrics")?),
        Cmd::Status => {
            let r = c.request("GET", "/api/v1/ready", None, &[])?;
            if json {
                println!("{}", r.text());
            } else {
                println!(
                    "{}",
                    if r.status == 200 {
                        "ready"
                    } else {
                        "not ready"
                    }
                );
            }
            if r.status != 200 {
                return Err(ClientError::Http {
                    status: r.status,
                    message: "not ready".into(),
                    field: None,
                });
            }
        }
        Cmd::ImportLio { .. } => unreachable!("handled above"),
    }
    Ok(())
}

/// Prints one object as JSON or YAML.
fn print_object<T: serde::Serialize>(json: bool, v: &T) {
    if json {
        print_json(v);
    } else {
        print!("{}", serde_norway::to_string(v).unwrap_or_default());
    }
}

fn main() -> ExitCode {
    // Output into a closed pipe (`rtgtctl ... | head`) ends the program quietly, as it does
    // other command-line tools, rather than as an error.
    // SAFETY: setting a signal's disposition to the default before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let mut ctx = Context::default();
    match run(Args::parse(), &mut ctx) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rtgtctl: {}", ctx.scrub(&e.to_string()));
            if let ClientError::Http { status: 401, .. } = e {
                eprintln!(
                    "rtgtctl: {}: --token-file FILE (rtgtd's state directory holds api-token)",
                    if ctx.token {
                        "the token was refused"
                    } else {
                        "the API needs a token"
                    }
                );
            }
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apply_takes_a_file_or_standard_input() {
        let parse = |a: &[&str]| Args::try_parse_from([&["rtgtctl"], a].concat());
        let file_of = |a: &[&str]| match parse(a).unwrap().cmd {
            Cmd::Apply {
                file,
                filename,
                dry_run,
            } => (filename.or(file).unwrap(), dry_run),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            file_of(&["apply", "x.yaml"]),
            (PathBuf::from("x.yaml"), false)
        );
        assert_eq!(file_of(&["apply", "-f", "-"]), (PathBuf::from("-"), false));
        assert_eq!(
            file_of(&["apply", "--dry-run", "--filename", "y"]),
            (PathBuf::from("y"), true)
        );
        assert!(parse(&["apply"]).is_err());
        assert!(parse(&["apply", "a", "-f", "b"]).is_err());
        assert!(parse(&["--socket", "/s", "--url", "http://h:1", "status"]).is_err());
        assert!(parse(&["--token", "t", "--token-file", "f", "status"]).is_err());
        let a = parse(&[
            "export",
            "-v",
            "--url",
            "https://h:1",
            "--ca-file",
            "ca.pem",
        ])
        .unwrap();
        assert!(a.verbose);
        assert_eq!(a.ca_file, Some(PathBuf::from("ca.pem")));
    }

    #[test]
    fn errors_never_show_the_secrets_handled() {
        let doc = "discovery:\n  auth:\n    chap: {user: d, secret: discovery-secret}\n    mutual_chap: {user: m, secret: 123456789012345}\ntargets:\n  - acls: [{auth: {chap: {user: u, secret: '********'}}}]\n";
        let secrets = document_secrets(doc);
        assert_eq!(secrets, ["discovery-secret", "123456789012345"]);
        let ctx = Context {
            secrets,
            token: false,
        };
        assert_eq!(
            ctx.scrub("invalid type: integer `123456789012345`, near discovery-secret"),
            "invalid type: integer `********`, near ********"
        );
        assert!(document_secrets("not: [yaml").is_empty());
    }
}
