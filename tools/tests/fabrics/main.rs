//! The targets of rtgt-iscsi and rtgt-srp driven through the initiators of this crate, in
//! one process: iSCSI over TCP ([`iscsi`]), iSER ([`iser`]) and SRP ([`srp`]) on soft-RoCE
//! loopback, and one table of task management cases run against all three ([`tmf`]).

mod iscsi;
mod iser;
mod srp;
mod tmf;
