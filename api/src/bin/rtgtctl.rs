//! rtgtctl: the command line over rtgtd's administration API.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use rtgt_api::client::{segment, Client, ClientError};
use rtgt_api::config::{
    Acl, Auth, Backstore, BackstoreKind, ByteSize, Chap, Config, Lun, MappedLun, PortalGroup,
    SrpAcl, SrpPort, Target,
};
use rtgt_api::server::Portal;
use rtgt_api::{ChangeReport, SessionView};

/// Manages a running rtgtd: backstores, targets, LUNs, ACLs, sessions and the whole
/// configuration. Talks to the unix socket of the state directory unless --url is given.
#[derive(Parser, Debug)]
#[command(name = "rtgtctl", version)]
struct Args {
    /// The API's unix socket.
    #[arg(long, env = "RTGT_SOCKET", default_value = "/var/lib/rtgt/rtgtd.sock")]
    socket: PathBuf,
    /// The API over TCP instead, e.g. http://192.0.2.10:8080.
    #[arg(long, env = "RTGT_URL")]
    url: Option<String>,
    /// Bearer token (listeners on addresses other than loopback require it).
    #[arg(long, env = "RTGT_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// File holding the bearer token.
    #[arg(long)]
    token_file: Option<PathBuf>,
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
    /// Applies a configuration file (YAML or JSON): only what differs changes.
    Apply { file: PathBuf },
    /// Prints the running configuration as YAML.
    Export {
        /// Include CHAP secrets.
        #[arg(long)]
        secrets: bool,
    },
    /// Converts a targetcli saveconfig.json into an rtgt configuration (offline).
    ImportLio {
        file: PathBuf,
        /// Write the result here instead of standard output.
        #[arg(long, short)]
        output: Option<PathBuf>,
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
        /// file, block, ramdisk or null.
        #[arg(long = "type", value_parser = parse_kind)]
        kind: BackstoreKind,
        #[arg(long)]
        path: Option<PathBuf>,
        #[arg(long, value_parser = ByteSize::parse)]
        size: Option<ByteSize>,
        #[arg(long, default_value_t = 512)]
        block_size: u32,
        #[arg(long)]
        read_only: bool,
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
    fn path(&self) -> String {
        format!(
            "/api/v1/targets/{}/tpgs/{}",
            segment(&self.target),
            self.tpg
        )
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

fn srp_path(name: &str) -> String {
    format!("/api/v1/srp/ports/{}", segment(name))
}

fn print_srp_ports(json: bool, v: &[SrpPort]) {
    if json {
        return print_json(&v);
    }
    table(
        &["PORT", "LISTEN", "ID_EXT", "IOC_GUID", "LUNS", "ACLS"],
        v.iter()
            .map(|p| {
                vec![
                    p.name.clone(),
                    p.listen
                        .iter()
                        .map(|a| a.to_string())
                        .collect::<Vec<_>>()
                        .join(","),
                    p.id_ext.clone().unwrap_or_else(|| "derived".into()),
                    p.ioc_guid.clone().unwrap_or_else(|| "derived".into()),
                    p.luns
                        .iter()
                        .map(|l| format!("{}={}", l.lun, l.backstore))
                        .collect::<Vec<_>>()
                        .join(","),
                    if p.allow_any_initiator {
                        "any".into()
                    } else {
                        p.acls.len().to_string()
                    },
                ]
            })
            .collect(),
    );
}

#[derive(Subcommand, Debug)]
enum SessionCmd {
    List,
    /// Ends a session at once.
    Logout {
        id: String,
    },
}

fn parse_kind(s: &str) -> Result<BackstoreKind, String> {
    match s {
        "file" => Ok(BackstoreKind::File),
        "block" => Ok(BackstoreKind::Block),
        "ramdisk" => Ok(BackstoreKind::Ramdisk),
        "null" => Ok(BackstoreKind::Null),
        _ => Err(format!("{s:?}: expected file, block, ramdisk or null")),
    }
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

fn backstore_rows(v: &[Backstore]) -> Vec<Vec<String>> {
    v.iter()
        .map(|b| {
            vec![
                b.name.clone(),
                format!("{:?}", b.kind).to_lowercase(),
                b.size.map(|s| s.to_string()).unwrap_or_else(|| "-".into()),
                b.block_size.to_string(),
                b.path
                    .as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_else(|| "-".into()),
                if b.read_only { "ro" } else { "rw" }.into(),
            ]
        })
        .collect()
}

fn print_backstores(json: bool, v: &[Backstore]) {
    if json {
        return print_json(&v);
    }
    table(
        &["NAME", "TYPE", "SIZE", "BLOCK", "PATH", "MODE"],
        backstore_rows(v),
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
                g.portals
                    .iter()
                    .map(|p| p.to_string())
                    .collect::<Vec<_>>()
                    .join(","),
                g.luns.len().to_string(),
                if g.allow_any_initiator {
                    "any".into()
                } else {
                    g.acls.len().to_string()
                },
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

fn run(args: Args) -> Result<(), ClientError> {
    let json = args.json;
    if let Cmd::ImportLio { file, output } = &args.cmd {
        let text = std::fs::read_to_string(file)?;
        let import = rtgt_api::lio::convert(&text).map_err(|message| ClientError::Http {
            status: 422,
            message,
            field: None,
        })?;
        for w in &import.warnings {
            eprintln!("warning: {w}");
        }
        let yaml = format!(
            "# Converted from {} by rtgtctl import-lio.\n{}",
            file.display(),
            import.config.to_yaml()
        );
        match output {
            Some(o) => import
                .config
                .save(o)
                .map_err(|e| ClientError::Io(std::io::Error::other(e.to_string())))?,
            None => print!("{yaml}"),
        }
        return Ok(());
    }
    let token = match (&args.token, &args.token_file) {
        (Some(t), _) => Some(t.clone()),
        (None, Some(f)) => Some(std::fs::read_to_string(f)?.trim().to_string()),
        _ => None,
    };
    let client = match &args.url {
        Some(u) => Client::url(u)?,
        None => Client::unix(&args.socket),
    }
    .with_token(token);
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
                path,
                size,
                block_size,
                read_only,
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
                    write_cache: true,
                    physical_block_size: None,
                    removable: false,
                    sanitize_rate: None,
                };
                let v = c.send("POST", "/api/v1/backstores", &b)?;
                let b: Backstore = serde_json::from_value(v)?;
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
                if json {
                    print_json(&t);
                } else {
                    print!("{}", serde_norway_yaml(&t));
                }
            }
            TargetCmd::Create {
                name,
                portals,
                allow_any_initiator,
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
                let v: Vec<Portal> = c.get(&format!("{}/portals", tpg.path()))?;
                if json {
                    print_json(&v);
                } else {
                    table(
                        &["PORTAL"],
                        v.iter().map(|p| vec![p.address.to_string()]).collect(),
                    );
                }
            }
            PortalCmd::Add { tpg, address } => {
                c.send(
                    "POST",
                    &format!("{}/portals", tpg.path()),
                    &Portal { address },
                )?;
            }
            PortalCmd::Remove { tpg, address } => c.delete(&format!(
                "{}/portals/{}",
                tpg.path(),
                segment(&address.to_string())
            ))?,
        },
        Cmd::Luns(cmd) => match cmd {
            LunCmd::List { tpg } => {
                let v: Vec<Lun> = c.get(&format!("{}/luns", tpg.path()))?;
                if json {
                    print_json(&v);
                } else {
                    table(
                        &["LUN", "BACKSTORE"],
                        v.iter()
                            .map(|l| vec![l.lun.to_string(), l.backstore.clone()])
                            .collect(),
                    );
                }
            }
            LunCmd::Add {
                tpg,
                lun,
                backstore,
            } => {
                c.send(
                    "POST",
                    &format!("{}/luns", tpg.path()),
                    &Lun { lun, backstore },
                )?;
            }
            LunCmd::Remove { tpg, lun } => c.delete(&format!("{}/luns/{lun}", tpg.path()))?,
        },
        Cmd::Acls(cmd) => match cmd {
            AclCmd::List { tpg } => {
                let v: Vec<Acl> = c.get(&format!("{}/acls", tpg.path()))?;
                if json {
                    print_json(&v);
                } else {
                    table(
                        &["INITIATOR", "AUTH", "MAPPED LUNS"],
                        v.iter()
                            .map(|a| {
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
                                        a.mapped_luns
                                            .iter()
                                            .map(|m| format!("{}={}", m.lun, m.tpg_lun))
                                            .collect::<Vec<_>>()
                                            .join(",")
                                    },
                                ]
                            })
                            .collect(),
                    );
                }
            }
            AclCmd::Add {
                tpg,
                initiator,
                chap_user,
                chap_secret,
                maps,
            } => {
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
                c.send("POST", &format!("{}/acls", tpg.path()), &acl)?;
            }
            AclCmd::Remove { tpg, initiator } => {
                c.delete(&format!("{}/acls/{}", tpg.path(), segment(&initiator)))?
            }
        },
        Cmd::Srp(cmd) => match cmd {
            SrpCmd::List => print_srp_ports(json, &c.get::<Vec<SrpPort>>("/api/v1/srp/ports")?),
            SrpCmd::Show { name } => {
                let p: SrpPort = c.get(&srp_path(&name))?;
                if json {
                    print_json(&p);
                } else {
                    print!("{}", serde_norway_yaml(&p));
                }
            }
            SrpCmd::Create {
                name,
                listen,
                id_ext,
                ioc_guid,
                allow_any_initiator,
            } => {
                let p = SrpPort {
                    name,
                    listen,
                    id_ext,
                    ioc_guid,
                    allow_any_initiator,
                    luns: Vec::new(),
                    acls: Vec::new(),
                };
                let p: SrpPort =
                    serde_json::from_value(c.send("POST", "/api/v1/srp/ports", &p)?)?;
                print_srp_ports(json, &[p]);
            }
            SrpCmd::Delete { name } => c.delete(&srp_path(&name))?,
            SrpCmd::AddLun {
                name,
                lun,
                backstore,
            } => {
                c.send(
                    "POST",
                    &format!("{}/luns", srp_path(&name)),
                    &Lun { lun, backstore },
                )?;
            }
            SrpCmd::RemoveLun { name, lun } => {
                c.delete(&format!("{}/luns/{lun}", srp_path(&name)))?
            }
            SrpCmd::AddAcl {
                name,
                initiator,
                maps,
            } => {
                let acl = SrpAcl {
                    initiator,
                    mapped_luns: maps,
                };
                c.send("POST", &format!("{}/acls", srp_path(&name)), &acl)?;
            }
            SrpCmd::RemoveAcl { name, initiator } => {
                c.delete(&format!("{}/acls/{}", srp_path(&name), segment(&initiator)))?
            }
        },
        Cmd::Sessions(cmd) => match cmd {
            SessionCmd::List => {
                let v: Vec<SessionView> = c.get("/api/v1/sessions")?;
                if json {
                    print_json(&v);
                } else {
                    table(
                        &[
                            "ID",
                            "INITIATOR",
                            "TARGET",
                            "TRANSPORT",
                            "PEER",
                            "QD",
                            "OUT",
                            "COMMANDS",
                            "UPTIME",
                        ],
                        v.iter()
                            .map(|s| {
                                vec![
                                    s.id.clone(),
                                    s.initiator.clone(),
                                    s.target.clone(),
                                    s.transport.clone(),
                                    s.peer.clone(),
                                    s.queue_depth.to_string(),
                                    s.outstanding.to_string(),
                                    s.commands.to_string(),
                                    format!("{}s", s.uptime_seconds),
                                ]
                            })
                            .collect(),
                    );
                }
            }
            SessionCmd::Logout { id } => c.delete(&format!("/api/v1/sessions/{}", segment(&id)))?,
        },
        Cmd::Apply { file } => {
            let text = std::fs::read_to_string(&file)?;
            print_report(json, &c.apply_yaml(&text)?);
        }
        Cmd::Export { secrets } => {
            let cfg: Config = c.get(if secrets {
                "/api/v1/config?secrets=true"
            } else {
                "/api/v1/config"
            })?;
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

fn serde_norway_yaml<T: serde::Serialize>(v: &T) -> String {
    serde_norway::to_string(v).unwrap_or_default()
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rtgtctl: {e}");
            ExitCode::FAILURE
        }
    }
}
