//! Raw FFI for the vendor libraries portalloc loads at run time.
#![no_std]
