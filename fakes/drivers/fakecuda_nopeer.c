/*
 * fakecuda_nopeer: the conformance driver without the peer-access calls
 * (cuDeviceCanAccessPeer, cuCtxEnablePeerAccess), everything else as fakecuda's — so that
 * asking for peer access (PORTALLOC_PEER_ACCESS, the C ABI's options.peer_access) is tested
 * against a driver that cannot give it. See fakecuda.c.
 */
#define FAKECUDA_NO_PEER 1
#include "fakecuda.c"
