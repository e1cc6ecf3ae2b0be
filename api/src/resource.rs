//! The REST resources of a port, alike on every fabric.
//!
//! Each kind of [`Port`] (an iSCSI portal group, an SRP target port) is served as a
//! collection of ports, each with its LUN list and its ACL list below it: the same
//! operations ([`OPERATIONS`]) at paths, parameter names and wording that its [`PortKind`]
//! gives. The server's handlers and OpenAPI document, the client and rtgtctl all work from
//! it, so another fabric's ports are one more [`PortKind`].
//!
//! Adding a kind (say NVMe-oF subsystems, their namespaces as the LUN list and their
//! allowed hosts as the ACL list): its type in the configuration with a [`Port`] impl
//! (and [`crate::config::PortAcl`] for its ACL), its own settings checked in
//! [`Config::validate`] and compared in [`crate::diff`], its LUNs listed by
//! [`Config::port_luns`], a [`PortKind`] impl here, and one line in [`each_kind`].

use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use utoipa::openapi::schema::Schema;
use utoipa::openapi::RefOr;
use utoipa::PartialSchema;

use crate::config::{Config, Item, Port, PortalGroup, SrpPort};

/// Where the API's paths start.
pub const API_PREFIX: &str = "/api/v1";

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

/// Path parameters, read in order as axum reads a tuple of them.
pub trait PathArgs: Sized + Send + Sync + 'static {
    /// How many there are.
    const LEN: usize;

    /// Reads them from the path's parameters.
    fn read<'de, S: SeqAccess<'de>>(seq: &mut S) -> Result<Self, S::Error>;

    /// Their values as path segments, in order.
    fn segments(&self, out: &mut Vec<String>);

    /// Their schemas for the OpenAPI document, in order.
    fn param_schemas(out: &mut Vec<RefOr<Schema>>);
}

impl PathArgs for () {
    const LEN: usize = 0;

    fn read<'de, S: SeqAccess<'de>>(_: &mut S) -> Result<(), S::Error> {
        Ok(())
    }

    fn segments(&self, _: &mut Vec<String>) {}

    fn param_schemas(_: &mut Vec<RefOr<Schema>>) {}
}

macro_rules! path_arg {
    ($($t:ty),*) => {$(
        impl PathArgs for $t {
            const LEN: usize = 1;

            fn read<'de, S: SeqAccess<'de>>(seq: &mut S) -> Result<$t, S::Error> {
                seq.next_element()?
                    .ok_or_else(|| de::Error::custom("a path parameter is missing"))
            }

            fn segments(&self, out: &mut Vec<String>) {
                out.push(segment(&self.to_string()));
            }

            fn param_schemas(out: &mut Vec<RefOr<Schema>>) {
                out.push(<$t as PartialSchema>::schema());
            }
        }
    )*};
}

path_arg!(String, u16, u64);

impl<A: PathArgs, B: PathArgs> PathArgs for (A, B) {
    const LEN: usize = A::LEN + B::LEN;

    fn read<'de, S: SeqAccess<'de>>(seq: &mut S) -> Result<(A, B), S::Error> {
        Ok((A::read(seq)?, B::read(seq)?))
    }

    fn segments(&self, out: &mut Vec<String>) {
        self.0.segments(out);
        self.1.segments(out);
    }

    fn param_schemas(out: &mut Vec<RefOr<Schema>>) {
        A::param_schemas(out);
        B::param_schemas(out);
    }
}

/// Path parameters deserialized as [`PathArgs`] (the way axum deserializes a tuple, with the
/// same errors).
pub struct Args<T>(pub T);

impl<'de, T: PathArgs> Deserialize<'de> for Args<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<'de, T: PathArgs> Visitor<'de> for V<T> {
            type Value = Args<T>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{} path parameters", T::LEN)
            }

            fn visit_seq<S: SeqAccess<'de>>(self, mut seq: S) -> Result<Args<T>, S::Error> {
                T::read(&mut seq).map(Args)
            }
        }
        d.deserialize_tuple(T::LEN, V(PhantomData))
    }
}

/// A part of a port the API serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The port itself, in its collection.
    Port,
    /// Its LUN list (`{port}/luns`).
    Luns,
    /// Its ACL list (`{port}/acls`).
    Acls,
}

/// What an operation does with a part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    /// GET of the list.
    List,
    /// POST of a new member.
    Add,
    /// GET of a member.
    Get,
    /// PUT of a member.
    Replace,
    /// DELETE of a member.
    Delete,
}

/// Every operation on the ports of a kind and on their lists.
pub const OPERATIONS: [(Part, Verb); 14] = [
    (Part::Port, Verb::List),
    (Part::Port, Verb::Add),
    (Part::Port, Verb::Get),
    (Part::Port, Verb::Replace),
    (Part::Port, Verb::Delete),
    (Part::Luns, Verb::List),
    (Part::Luns, Verb::Add),
    (Part::Luns, Verb::Get),
    (Part::Luns, Verb::Delete),
    (Part::Acls, Verb::List),
    (Part::Acls, Verb::Add),
    (Part::Acls, Verb::Get),
    (Part::Acls, Verb::Replace),
    (Part::Acls, Verb::Delete),
];

/// How the API serves one kind of port: where its collection is and what names a port in
/// it, how answers, the log and the OpenAPI document name it.
pub trait PortKind: Port + Item {
    /// The path parameters naming the collection: the target of a portal group, none for
    /// SRP ports.
    type Parent: PathArgs;

    /// What names a port in its collection: the tag of a portal group, the name of an SRP
    /// port.
    type Id: PathArgs + PartialEq;

    /// The collection's path below [`API_PREFIX`], its parameters in braces.
    const COLLECTION: &'static str;

    /// The id's field and path parameter: `tag`, `name`.
    const ID: &'static str;

    /// The description of each path parameter naming a port: the parent's, then the id's.
    const PARAMS: &'static [&'static str];

    /// The description of the `{initiator}` path parameter.
    const INITIATOR: &'static str;

    /// How the log names a port: `portal group`, `SRP target port`.
    const NAME: &'static str;

    /// What starts the log's names of changes to its LUNs and ACLs (`SRP ` in `add SRP LUN`).
    const LIST_PREFIX: &'static str;

    /// How operation ids name a port: `tpg` (`get_tpg`), `srp_port`.
    const OPERATION_NOUN: &'static str;

    /// What starts the operation ids of its LUNs and ACLs: `srp_` (`get_srp_lun`).
    const OPERATION_PREFIX: &'static str;

    /// How the refusal to unmap a LUN that an ACL maps names the initiator: `LUN 1 is
    /// mapped {MAPPED_FOR} {initiator}`.
    const MAPPED_FOR: &'static str;

    /// Why the last port of a collection cannot be deleted, when it cannot.
    const KEEP_ONE: Option<&'static str> = None;

    /// Its id.
    fn id(&self) -> Self::Id;

    /// Its collection in `c`; the error says what is missing.
    fn collection_mut<'a>(
        c: &'a mut Config,
        parent: &Self::Parent,
    ) -> Result<&'a mut Vec<Self>, String>;

    /// How answers name a port: `portal group 1`, `SRP target port "p0"`.
    fn describe(id: &Self::Id) -> String;

    /// Why no port `id` is found in the collection of `parent`.
    fn missing(_parent: &Self::Parent, id: &Self::Id) -> String {
        format!("no {}", Self::describe(id))
    }

    /// The OpenAPI tag of a part's operations.
    fn tag(part: Part) -> &'static str;

    /// The summary of an operation in the OpenAPI document, where it has one.
    fn summary(part: Part, verb: Verb) -> Option<&'static str>;
}

/// The path of a port below [`API_PREFIX`], its parameters in braces.
pub fn port_template<K: PortKind>() -> String {
    format!("{}/{{{}}}", K::COLLECTION, K::ID)
}

/// The path of an operation below [`API_PREFIX`], its parameters in braces.
pub fn template<K: PortKind>(part: Part, verb: Verb) -> String {
    let list = matches!(verb, Verb::List | Verb::Add);
    match (part, list) {
        (Part::Port, true) => K::COLLECTION.to_string(),
        (Part::Port, false) => port_template::<K>(),
        (Part::Luns, true) => format!("{}/luns", port_template::<K>()),
        (Part::Luns, false) => format!("{}/luns/{{lun}}", port_template::<K>()),
        (Part::Acls, true) => format!("{}/acls", port_template::<K>()),
        (Part::Acls, false) => format!("{}/acls/{{initiator}}", port_template::<K>()),
    }
}

/// The operation id of an operation, e.g. `list_tpgs`, `add_srp_lun`.
pub fn operation_id<K: PortKind>(part: Part, verb: Verb) -> String {
    let verb_word = match (part, verb) {
        (_, Verb::List) => "list",
        (Part::Port, Verb::Add) => "create",
        (_, Verb::Add) => "add",
        (_, Verb::Get) => "get",
        (_, Verb::Replace) => "replace",
        (_, Verb::Delete) => "delete",
    };
    let noun = match part {
        Part::Port => K::OPERATION_NOUN.to_string(),
        Part::Luns => format!("{}lun", K::OPERATION_PREFIX),
        Part::Acls => format!("{}acl", K::OPERATION_PREFIX),
    };
    let plural = if verb == Verb::List { "s" } else { "" };
    format!("{verb_word}_{noun}{plural}")
}

/// How the log names a change: `add LUN`, `delete SRP target port`.
pub fn request_name<K: PortKind>(part: Part, verb: Verb) -> String {
    let verb_word = match (part, verb) {
        (Part::Port, Verb::Add) => "create",
        (_, Verb::Add) => "add",
        (_, Verb::Replace) => "replace",
        (_, Verb::Delete) => "delete",
        (_, Verb::List | Verb::Get) => "read",
    };
    match part {
        Part::Port => format!("{verb_word} {}", K::NAME),
        Part::Luns => format!("{verb_word} {}LUN", K::LIST_PREFIX),
        Part::Acls => format!("{verb_word} {}ACL", K::LIST_PREFIX),
    }
}

/// Fills the parameters of `template` with `values`, in order.
fn fill(template: &str, values: &[String]) -> String {
    let mut out = String::new();
    let mut rest = template;
    let mut values = values.iter();
    while let Some(open) = rest.find('{') {
        let close = rest[open..].find('}').map_or(rest.len(), |c| open + c + 1);
        out.push_str(&rest[..open]);
        out.push_str(values.next().map_or("", String::as_str));
        rest = &rest[close..];
    }
    out.push_str(rest);
    out
}

/// The path of the collection of ports of kind `K` that `parent` names, e.g.
/// `/api/v1/targets/iqn…/tpgs`.
pub fn collection_path<K: PortKind>(parent: &K::Parent) -> String {
    let mut values = Vec::new();
    parent.segments(&mut values);
    format!("{API_PREFIX}{}", fill(K::COLLECTION, &values))
}

/// Where one port is in the API, e.g. `/api/v1/targets/iqn…/tpgs/1`; its LUN and ACL lists
/// are below it.
pub struct PortPath<K> {
    path: String,
    kind: PhantomData<fn() -> K>,
}

impl<K: PortKind> PortPath<K> {
    /// Port `id` of the collection of `parent`.
    pub fn new(parent: &K::Parent, id: &K::Id) -> PortPath<K> {
        let mut values = Vec::new();
        parent.segments(&mut values);
        id.segments(&mut values);
        PortPath {
            path: format!("{API_PREFIX}{}", fill(&port_template::<K>(), &values)),
            kind: PhantomData,
        }
    }

    /// The port's own path.
    pub fn as_str(&self) -> &str {
        &self.path
    }

    /// Its LUN list.
    pub fn luns(&self) -> String {
        format!("{}/luns", self.path)
    }

    /// One of its LUNs.
    pub fn lun(&self, lun: u64) -> String {
        format!("{}/luns/{lun}", self.path)
    }

    /// Its ACL list.
    pub fn acls(&self) -> String {
        format!("{}/acls", self.path)
    }

    /// The ACL of one initiator.
    pub fn acl(&self, initiator: &str) -> String {
        format!("{}/acls/{}", self.path, segment(initiator))
    }
}

impl<K> fmt::Debug for PortPath<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("PortPath").field(&self.path).finish()
    }
}

/// Something done for every kind of port the API serves.
pub trait EachKind {
    fn kind<K: PortKind>(&mut self);
}

/// Does `each` for every kind of port the API serves.
pub fn each_kind(each: &mut impl EachKind) {
    each.kind::<PortalGroup>();
    each.kind::<SrpPort>();
}

impl PortKind for PortalGroup {
    type Parent = String;
    type Id = u16;

    const COLLECTION: &'static str = "/targets/{target}/tpgs";
    const ID: &'static str = "tag";
    const PARAMS: &'static [&'static str] = &["Target name", "Portal group tag"];
    const INITIATOR: &'static str = "Initiator name";
    const NAME: &'static str = "portal group";
    const LIST_PREFIX: &'static str = "";
    const OPERATION_NOUN: &'static str = "tpg";
    const OPERATION_PREFIX: &'static str = "";
    const MAPPED_FOR: &'static str = "in the ACL of";
    const KEEP_ONE: Option<&'static str> =
        Some("a target needs at least one portal group: delete the target instead");

    fn id(&self) -> u16 {
        self.tag
    }

    fn collection_mut<'a>(c: &'a mut Config, target: &String) -> Result<&'a mut Vec<Self>, String> {
        c.targets
            .iter_mut()
            .find(|t| t.name == *target)
            .map(|t| &mut t.portal_groups)
            .ok_or_else(|| format!("no target {target:?}"))
    }

    fn describe(tag: &u16) -> String {
        format!("portal group {tag}")
    }

    fn missing(target: &String, tag: &u16) -> String {
        format!("target {target:?} has no portal group {tag}")
    }

    fn tag(part: Part) -> &'static str {
        match part {
            Part::Port => "targets",
            Part::Luns => "luns",
            Part::Acls => "acls",
        }
    }

    fn summary(part: Part, verb: Verb) -> Option<&'static str> {
        match (part, verb) {
            (Part::Luns, Verb::Add) => Some(
                "Maps a backstore as a LUN; sessions that see it get REPORTED LUNS DATA HAS CHANGED.",
            ),
            (Part::Luns, Verb::Delete) => {
                Some("Unmaps a LUN; sessions that saw it get REPORTED LUNS DATA HAS CHANGED.")
            }
            (Part::Acls, Verb::Replace) => {
                Some("Replaces an ACL; the initiator's sessions see the new LUN map at once.")
            }
            (Part::Acls, Verb::Delete) => {
                Some("Removes an ACL and ends that initiator's sessions (only those).")
            }
            _ => None,
        }
    }
}

impl PortKind for SrpPort {
    type Parent = ();
    type Id = String;

    const COLLECTION: &'static str = "/srp/ports";
    const ID: &'static str = "name";
    const PARAMS: &'static [&'static str] = &["SRP target port name"];
    const INITIATOR: &'static str = "Initiator port identifier (0x and 32 hex digits)";
    const NAME: &'static str = "SRP target port";
    const LIST_PREFIX: &'static str = "SRP ";
    const OPERATION_NOUN: &'static str = "srp_port";
    const OPERATION_PREFIX: &'static str = "srp_";
    const MAPPED_FOR: &'static str = "for";

    fn id(&self) -> String {
        self.name.clone()
    }

    fn collection_mut<'a>(c: &'a mut Config, _: &()) -> Result<&'a mut Vec<Self>, String> {
        Ok(&mut c.srp)
    }

    fn describe(name: &String) -> String {
        format!("SRP target port {name:?}")
    }

    fn tag(_: Part) -> &'static str {
        "srp"
    }

    fn summary(part: Part, verb: Verb) -> Option<&'static str> {
        match (part, verb) {
            (Part::Port, Verb::Add) => Some(
                "Creates an SRP target port; its RDMA/CM listeners start at once (when the RDMA device\nis up).",
            ),
            (Part::Port, Verb::Replace) => Some(
                "Replaces an SRP target port. LUN and ACL changes reach live sessions at once; a new\nidentifier or new listen addresses log its channels out.",
            ),
            (Part::Port, Verb::Delete) => Some(
                "Deletes an SRP target port: its channels get SRP_T_LOGOUT, its listeners stop.",
            ),
            (Part::Luns, Verb::Add) => Some(
                "Maps a backstore as a LUN of the port; sessions that see it get REPORTED LUNS DATA\nHAS CHANGED.",
            ),
            (Part::Luns, Verb::Delete) => Some(
                "Unmaps a LUN of the port; sessions that saw it get REPORTED LUNS DATA HAS CHANGED.",
            ),
            (Part::Acls, Verb::Replace) => {
                Some("Replaces an ACL; the initiator's sessions see the new LUN map at once.")
            }
            (Part::Acls, Verb::Delete) => {
                Some("Removes an ACL: that initiator's channels (only those) get SRP_T_LOGOUT.")
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_names() {
        let tpg = PortPath::<PortalGroup>::new(&"iqn.2025-01.io.rtgt:t".into(), &1);
        assert_eq!(tpg.as_str(), "/api/v1/targets/iqn.2025-01.io.rtgt:t/tpgs/1");
        assert_eq!(
            tpg.lun(3),
            "/api/v1/targets/iqn.2025-01.io.rtgt:t/tpgs/1/luns/3"
        );
        assert_eq!(
            tpg.acl("iqn.x:a b"),
            "/api/v1/targets/iqn.2025-01.io.rtgt:t/tpgs/1/acls/iqn.x:a%20b"
        );
        let srp = PortPath::<SrpPort>::new(&(), &"p/0".into());
        assert_eq!(srp.as_str(), "/api/v1/srp/ports/p%2F0");
        assert_eq!(srp.luns(), "/api/v1/srp/ports/p%2F0/luns");
        assert_eq!(
            template::<PortalGroup>(Part::Acls, Verb::Get),
            "/targets/{target}/tpgs/{tag}/acls/{initiator}"
        );
        assert_eq!(template::<SrpPort>(Part::Port, Verb::List), "/srp/ports");
        assert_eq!(collection_path::<SrpPort>(&()), "/api/v1/srp/ports");
        assert_eq!(
            collection_path::<PortalGroup>(&"iqn.2025-01.io.rtgt:t".into()),
            "/api/v1/targets/iqn.2025-01.io.rtgt:t/tpgs"
        );
        let ids: Vec<_> = OPERATIONS
            .iter()
            .map(|(p, v)| operation_id::<SrpPort>(*p, *v))
            .collect();
        assert_eq!(
            ids[..3],
            ["list_srp_ports", "create_srp_port", "get_srp_port"]
        );
        assert_eq!(
            operation_id::<PortalGroup>(Part::Luns, Verb::List),
            "list_luns"
        );
        assert_eq!(
            request_name::<SrpPort>(Part::Luns, Verb::Add),
            "add SRP LUN"
        );
        assert_eq!(
            request_name::<PortalGroup>(Part::Port, Verb::Delete),
            "delete portal group"
        );
    }
}
