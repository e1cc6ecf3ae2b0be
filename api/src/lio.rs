//! LIO import.
