//! Built-in workloads (being written).
