//! `define_ops!`: the `Op` enum and its per-variant queries generated from
//! one table (`op.rs`), Cranelift's `meta/shared/instructions.rs` in a
//! macro. Each row is a variant as it would be written in the enum — its
//! doc comment, its fields with theirs — followed by what the rest of the
//! compiler asks of every op:
//!
//! ```text
//! Variant { field: Type, ... }
//!     => tag N, name EXPR, class CLASS, inputs EXPR, outputs EXPR,
//!        effects |library| EXPR;
//! ```
//!
//! `tag` is the variant's stable number (keys, caches); `name` is printed;
//! `class` is an [`crate::OpClass`]; `inputs` and `outputs` are the arity
//! (`None` where the callee decides); `effects` may read the function
//! library. The expressions see the row's fields by name. A tuple variant
//! names its one field: `Unary(u: UnaryOp)`.
//!
//! From the table come the enum, [`crate::Op::tag`], `name`, `class`,
//! `num_inputs`, `num_outputs`, `effects`, and through the [`crate::attr::Attr`]
//! trait of each field's type the op key ([`crate::OpKey`]) and structural
//! equality: a new op is a row here plus its semantics (inference, the
//! reference kernel, the printer and parser, gradients), and the compiler
//! points at each of those.

/// Generates `Op` from the op table (see the module docs).
macro_rules! define_ops {
    (
        $(#[$meta:meta])*
        pub enum $Op:ident {
            $(
                $(#[$doc:meta])*
                $v:ident
                $( ( $tf:ident : $tty:ty ) )?
                $( { $( $(#[$fdoc:meta])* $f:ident : $ft:ty ),* $(,)? } )?
                => tag $tag:literal, name $name:expr, class $class:ident,
                   inputs $ni:expr, outputs $no:expr, effects |$lib:ident| $eff:expr;
            )*
        }
    ) => {
        $(#[$meta])*
        pub enum $Op {
            $(
                $(#[$doc])*
                $v $( ($tty) )? $( { $( $(#[$fdoc])* $f: $ft ),* } )?,
            )*
        }

        // The expressions of a row name only the fields they use.
        #[allow(unused_variables)]
        impl $Op {
            /// Every variant's name and tag, in table order (tests check the
            /// tags are distinct; tools list the ops).
            pub const VARIANTS: &'static [(&'static str, u64)] = &[$( (stringify!($v), $tag), )*];

            /// The variant's stable number, from the op table: what op keys
            /// and the JIT's kernel keys start with.
            pub fn tag(&self) -> u64 {
                match self {
                    $( $Op::$v { .. } => $tag, )*
                }
            }

            /// The op's name as printed in listings and error messages
            /// (`add`, `reduce_sum`, `matmul`).
            pub fn name(&self) -> &'static str {
                match self {
                    $( $Op::$v $( ($tf) )? $( { $($f),* } )? => $name, )*
                }
            }

            /// The op's class: which kind of op each variant is, from the op
            /// table. Passes that ask one fact of every op (is it stateful?
            /// a source? does it hold code?) ask it here instead of listing
            /// the variants again; matches that do something different per
            /// op stay exhaustive.
            pub fn class(&self) -> $crate::OpClass {
                match self {
                    $( $Op::$v { .. } => $crate::OpClass::$class, )*
                }
            }

            /// How many data inputs the op takes, or `None` when it varies
            /// (`concat`, `stack`: at least one; `call`: the callee's
            /// parameter count).
            pub fn num_inputs(&self) -> Option<usize> {
                match self {
                    $( $Op::$v $( ($tf) )? $( { $($f),* } )? => $ni, )*
                }
            }

            /// How many outputs the op produces, or `None` for `call` (the
            /// callee's output count).
            pub fn num_outputs(&self) -> Option<usize> {
                match self {
                    $( $Op::$v $( ($tf) )? $( { $($f),* } )? => $no, )*
                }
            }

            /// What running the op does besides computing its outputs. An
            /// op with subgraphs has the effects of everything in them, and
            /// a `call` those of its callee in `library` (an unknown callee
            /// counts as writing, so that nothing is dropped on a guess).
            /// Passes never fold, merge, reorder or drop an op whose effects
            /// are not [`crate::Effects::PURE`].
            pub fn effects(&self, library: &$crate::FunctionLibrary) -> $crate::Effects {
                match self {
                    $( $Op::$v $( ($tf) )? $( { $($f),* } )? => {
                        let $lib = library;
                        $eff
                    } )*
                }
            }

            /// Appends the tag and every attribute's key words.
            pub(crate) fn write_key(&self, k: &mut $crate::attr::KeyWriter) {
                match self {
                    $( $Op::$v $( ($tf) )? $( { $($f),* } )? => {
                        k.word($tag);
                        $crate::attr::AttrList::key(&( $($tf,)? $($($f,)*)? ), k);
                    } )*
                }
            }

            /// Same variant and structurally equal attributes; a
            /// difference inside a nested graph is described in `diff`.
            pub(crate) fn same_as(&self, other: &$Op, diff: &mut String) -> bool {
                match self {
                    $( $Op::$v $( ($tf) )? $( { $($f),* } )? => {
                        let mine = ( $($tf,)? $($($f,)*)? );
                        match other {
                            $Op::$v $( ($tf) )? $( { $($f),* } )? => {
                                $crate::attr::AttrList::same(&mine, &( $($tf,)? $($($f,)*)? ), diff)
                            }
                            _ => false,
                        }
                    } )*
                }
            }
        }
    };
}

pub(crate) use define_ops;
