/// Defines a field-value enum with an `Unknown` variant that keeps any other value, and the
/// conversions both ways, so that parsing never fails on an unassigned code point and
/// `u(T::from(x)) == x` holds for every `x`.
macro_rules! enum_with_unknown {
    (
        $(#[$enum_attr:meta])*
        pub enum $name:ident($ty:ty) {
            $(
                $(#[$variant_attr:meta])*
                $variant:ident = $value:expr
            ),+ $(,)?
        }
    ) => {
        #[derive(Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Clone, Copy)]
        $(#[$enum_attr])*
        pub enum $name {
            $(
                $(#[$variant_attr])*
                $variant
            ),*,
            /// A value without a name here.
            Unknown($ty),
        }

        impl ::core::convert::From<$ty> for $name {
            fn from(value: $ty) -> Self {
                match value {
                    $( $value => $name::$variant ),*,
                    other => $name::Unknown(other),
                }
            }
        }

        impl ::core::convert::From<$name> for $ty {
            fn from(value: $name) -> Self {
                match value {
                    $( $name::$variant => $value ),*,
                    $name::Unknown(other) => other,
                }
            }
        }
    };
}

/// Defines the view type `Packet<T>` of a header with a fixed minimum length, with the
/// constructors, `check_len`, `into_inner` and `AsRef<[u8]>` that every view has.
macro_rules! fixed_len_view {
    ($(#[$attr:meta])* pub struct Packet; len = $len:expr) => {
        $(#[$attr])*
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct Packet<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> Packet<T> {
            /// Wraps a buffer without checking its length.
            pub const fn new_unchecked(buffer: T) -> Packet<T> {
                Packet { buffer }
            }

            /// Wraps a buffer and checks that it is long enough for every accessor.
            pub fn new_checked(buffer: T) -> $crate::wire::Result<Packet<T>> {
                let packet = Self::new_unchecked(buffer);
                packet.check_len()?;
                Ok(packet)
            }

            /// Checks that no accessor will panic.
            pub fn check_len(&self) -> $crate::wire::Result<()> {
                if self.buffer.as_ref().len() < $len {
                    Err($crate::wire::Error)
                } else {
                    Ok(())
                }
            }

            /// Returns the underlying buffer.
            pub fn into_inner(self) -> T {
                self.buffer
            }
        }

        impl<T: AsRef<[u8]>> AsRef<[u8]> for Packet<T> {
            fn as_ref(&self) -> &[u8] {
                self.buffer.as_ref()
            }
        }
    };
}
