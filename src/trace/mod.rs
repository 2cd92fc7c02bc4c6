//! Allocation traces: one event format, importers, exporters, replay (being written).
