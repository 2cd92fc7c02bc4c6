#!/usr/bin/env python3
"""Writes the pickles of tests/not_a_trace.rs: objects people pickle that are not a PyTorch
memory snapshot, made by Python's own pickle module (the independent oracle of what each file
is). numpy, torch and the user class are stood in for by modules of the same names, whose
objects reduce the way the real ones do (numpy.ndarray.__reduce__, torch.Tensor under
pickle.dumps), so neither library is needed. Run from this directory: python3 make.py"""
import collections
import pickle
import sys
import types


def global_function(modname, name):
    """A function `modname.name` that pickle can name (it looks modules up in sys.modules)."""
    parts = modname.split('.')
    for i in range(1, len(parts) + 1):
        sys.modules.setdefault('.'.join(parts[:i]), types.ModuleType('.'.join(parts[:i])))

    def f(*args):
        return None

    f.__module__, f.__qualname__, f.__name__ = modname, name, name
    setattr(sys.modules[modname], name, f)
    return f


reconstruct = global_function('numpy.core.multiarray', '_reconstruct')
ndarray = global_function('numpy', 'ndarray')
rebuild_tensor = global_function('torch._utils', '_rebuild_tensor_v2')
load_from_bytes = global_function('torch.storage', '_load_from_bytes')


class NumpyArray:
    def __reduce__(self):
        # numpy.ndarray.__reduce__: (_reconstruct, (ndarray, (0,), b'b'), state)
        return (reconstruct, (ndarray, (0,), b'b'), (1, (3,), 'f8', False, b'\0' * 24))


class TorchTensor:
    def __reduce__(self):
        # torch.Tensor under pickle.dumps: _rebuild_tensor_v2 of a storage loaded from bytes
        return (rebuild_tensor,
                ((load_from_bytes, (b'PK\x03\x04',)), 0, (3,), (1,), False,
                 collections.OrderedDict()))


class Model:
    def __init__(self):
        self.segments = []  # a snapshot's key, as an attribute: still not a snapshot


global_function('mylib.models', 'unused')
Model.__module__, Model.__qualname__ = 'mylib.models', 'Model'
sys.modules['mylib.models'].Model = Model

# A global whose module name holds an escape sequence and is long: pickle refuses to write
# one, so its bytes are put together by hand (STACK_GLOBAL of two strings, called with ()).
hostile = ('\x1b[31m' + 'x' * 200).encode()
escape_global = (b'\x80\x04\x8c' + bytes([len(hostile)]) + hostile + b'\x8c\x05deque\x93)R.')

files = {
    'deque-protocol4.pickle': pickle.dumps(collections.deque([1, 2, 3]), protocol=4),
    'deque-protocol2.pickle': pickle.dumps(collections.deque([1, 2, 3]), protocol=2),
    'ordered-dict.pickle': pickle.dumps(collections.OrderedDict(a=1), protocol=4),
    'numpy-array.pickle': pickle.dumps(NumpyArray(), protocol=2),
    'torch-tensor.pickle': pickle.dumps(TorchTensor(), protocol=2),
    'class-instance.pickle': pickle.dumps(Model(), protocol=2),
    'class-itself.pickle': pickle.dumps(collections.deque, protocol=4),
    'escape-in-global.pickle': escape_global,
    'dict-two-keys.pickle': pickle.dumps({'foo': 1, 'bar': [1, 2]}, protocol=4),
    'dict-twelve-keys.pickle': pickle.dumps({f'k{i}': i for i in range(12)}, protocol=4),
    'dict-empty.pickle': pickle.dumps({}, protocol=4),
    'dict-bytes-key.pickle': pickle.dumps({b'\x1b]0;title\x07': 1}, protocol=4),
}
# A snapshot as torch.cuda.memory._dump_snapshot writes it, small: re-pickled at protocols 0
# and 1 (text opcodes, no PROTO), which the sniffer must know, and at 4 to compare with.
snapshot = {
    'segments': [{'device': 0, 'address': 0x10000000, 'total_size': 2 << 20, 'stream': 0,
                  'blocks': [{'address': 0x10000000, 'size': 1024, 'requested_size': 1000,
                              'state': 'active_allocated'}]}],
    'device_traces': [[
        {'action': 'alloc', 'addr': 0x10000000, 'size': 1024, 'stream': 0, 'time_us': 10},
        {'action': 'alloc', 'addr': 0x10000400, 'size': 512, 'stream': 0, 'time_us': 11},
        {'action': 'free_completed', 'addr': 0x10000400, 'size': 512, 'stream': 0,
         'time_us': 12},
    ]],
    'allocator_settings': {},
}
for protocol in (0, 1, 4):
    files[f'snapshot-protocol{protocol}.pickle'] = pickle.dumps(snapshot, protocol=protocol)
files['deque-protocol0.pickle'] = pickle.dumps(collections.deque([1, 2, 3]), protocol=0)
files['list-protocol0.pickle'] = pickle.dumps([1, 2, 3], protocol=0)
files['list-protocol1.pickle'] = pickle.dumps([1, 2, 3], protocol=1)
# The traces without the segments: some other dict, not a snapshot of device 0.
for protocol in (0, 4):
    files[f'device-traces-only-protocol{protocol}.pickle'] = pickle.dumps(
        {'device_traces': []}, protocol=protocol)
# Both keys, no device traced.
files['no-device-traced.pickle'] = pickle.dumps(
    {'segments': [], 'device_traces': []}, protocol=4)
for name, data in files.items():
    with open(name, 'wb') as f:
        f.write(data)
