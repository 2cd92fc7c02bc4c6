/*
 * fakecuda_old: the conformance driver as a CUDA 10.1 driver would be — no virtual-memory
 * (10.2) or memory-pool (11.2) symbols, attributes 102 and 115 unset, version 10010 — so the
 * shim's capability gates and optional-symbol handling are tested. See fakecuda.c.
 */
#define FAKECUDA_OLD 1
#include "fakecuda.c"
