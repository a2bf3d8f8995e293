//! RowanKV's Redis command layer (being written).
#![forbid(unsafe_code)]
