/*
 * fakecuda_nopeer: the conformance driver on a system without peer links — two devices (unless
 * FAKECUDA_DEVICES says otherwise), every call fakecuda exports, and every pair refused:
 * cuDeviceCanAccessPeer answers 0, cuCtxEnablePeerAccess CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, the
 * P2P attributes 0 — so that asking for peer access (PORTALLOC_PEER_ACCESS, the C ABI's
 * options.peer_access) is tested against a driver that cannot give it. See fakecuda.c.
 */
#define FAKECUDA_NO_PEER 1
#include "fakecuda.c"
