//! Defaults and omission tests of document fields, shared by the sections of the
//! configuration.

pub(crate) fn yes() -> bool {
    true
}

pub(crate) fn is_true(v: &bool) -> bool {
    *v
}

pub(crate) fn is_false(v: &bool) -> bool {
    !*v
}

pub(crate) fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}
