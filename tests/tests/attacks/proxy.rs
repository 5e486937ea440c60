//! See the crate doc in `main.rs`.
