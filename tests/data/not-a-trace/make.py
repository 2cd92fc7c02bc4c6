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


class Memory(list):
    """A replay memory that is a list: pickled as NEWOBJ, then APPENDS of its items."""


Memory.__module__, Memory.__qualname__ = 'mylib.models', 'Memory'
sys.modules['mylib.models'].Memory = Memory

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

# An RL replay memory: a list of deques (protocol 3, as Python 3.0-3.7 wrote by default) of
# numpy arrays. A deque pickles as REDUCE of collections.deque then APPENDS of its items.
files['list-of-deques-protocol3.pickle'] = pickle.dumps(
    [collections.deque([NumpyArray(), NumpyArray()], maxlen=1000),
     collections.deque([NumpyArray()], maxlen=1000)], protocol=3)
# The same with other objects that take items: OrderedDicts (REDUCE then SETITEMS), an
# instance of a subclass of list (NEWOBJ then APPENDS), and a list of a deque and an int.
files['list-of-ordered-dicts.pickle'] = pickle.dumps(
    [collections.OrderedDict(a=1), collections.OrderedDict(b=2)], protocol=4)
files['list-subclass.pickle'] = pickle.dumps(Memory([1, 2, 3]), protocol=4)
files['list-mixed.pickle'] = pickle.dumps([collections.deque([1]), 5], protocol=4)
# A list of dicts that are not segments: still a list.
files['list-of-dicts.pickle'] = pickle.dumps([{'device': 0, 'address': 4096}], protocol=4)
# pickle.dump called twice on one file: two whole pickles, one after the other; protocols 4
# (PROTO first) and 0 (no PROTO: known by reading it); two snapshots; and a pickle followed
# by zero bytes that start no pickle (a file padded past its end).
files['two-pickles-protocol4.pickle'] = (pickle.dumps([1, 2, 3], protocol=4)
                                         + pickle.dumps({'a': 1}, protocol=4))
files['two-pickles-protocol0.pickle'] = (pickle.dumps([1, 2, 3], protocol=0)
                                         + pickle.dumps({'a': 1}, protocol=0))
files['two-snapshots.pickle'] = pickle.dumps(snapshot, protocol=4) * 2
files['pickle-then-zeros.pickle'] = pickle.dumps([1, 2, 3], protocol=4) + bytes(8)


# What torch.cuda.memory_snapshot() returns (the segments of torch._C._cuda_memorySnapshot(),
# with the keys and value types its segment and block dicts have), pickled as users do:
# pickle.dump(torch.cuda.memory_snapshot(), f). Device 0 holds two segments, device 1 one.
# The blocks live (active_allocated or active_pending_free), at their requested sizes:
# device 0: 8,000,000 + 4,194,304 (pending free) + 400 + 1,000; device 1: 100.
def block(address, size, requested, state, frames=()):
    return {'address': address, 'size': size, 'requested_size': requested, 'state': state,
            'frames': list(frames)}


def segment(device, address, segment_type, blocks):
    live = [b for b in blocks if b['state'] != 'inactive']
    return {'device': device, 'address': address,
            'total_size': sum(b['size'] for b in blocks),
            'allocated_size': sum(b['size'] for b in blocks if b['state'] == 'active_allocated'),
            'active_size': sum(b['size'] for b in live),
            'requested_size': sum(b['requested_size'] for b in live),
            'stream': 0, 'segment_type': segment_type, 'segment_pool_id': (0, 0),
            'is_expandable': False, 'frames': [], 'blocks': blocks}


frame = {'filename': 'train.py', 'line': 42, 'name': 'forward'}
segments = [
    segment(0, 0x7f0000000000, 'large', [
        block(0x7f0000000000, 8 << 20, 8_000_000, 'active_allocated', [frame]),
        block(0x7f0000800000, 4 << 20, 4 << 20, 'active_pending_free'),
        block(0x7f0000c00000, 8 << 20, 0, 'inactive'),
    ]),
    segment(0, 0x7f0002000000, 'small', [
        block(0x7f0002000000, 512, 400, 'active_allocated', [frame]),
        block(0x7f0002000200, 1024, 1000, 'active_allocated'),
        block(0x7f0002000600, (2 << 20) - 1536, 0, 'inactive'),
    ]),
    segment(1, 0x7f1000000000, 'small', [
        block(0x7f1000000000, 512, 100, 'active_allocated'),
        block(0x7f1000000200, (2 << 20) - 512, 0, 'inactive'),
    ]),
]
for protocol in (2, 4):
    files[f'segment-list-protocol{protocol}.pickle'] = pickle.dumps(segments, protocol=protocol)



# Segment lists with one value torch never writes, each at a known place (segment 1 or its
# block 1, from 0; segment 2 is device 1's): refused naming the segment, the block and the
# field, not read as 0 B or device 0, nor called "a list".
def altered(change):
    """A deep copy of `segments` with `change` applied to it."""
    copy = pickle.loads(pickle.dumps(segments))
    change(copy)
    return pickle.dumps(copy, protocol=4)


def setter(segment, field, value, block=None):
    def change(copy):
        target = copy[segment] if block is None else copy[segment]['blocks'][block]
        target[field] = value
    return change


def two_huge_blocks(copy):
    # Two live blocks of 2**63 bytes each: their sum is past 64 bits.
    for b in copy[1]['blocks'][:2]:
        b['size'] = b['requested_size'] = 2**63


bad_segment_lists = {
    'total-size-2-70': setter(1, 'total_size', 2**70),
    'blocks-sum-past-64-bits': two_huge_blocks,
    'total-size-negative': setter(1, 'total_size', -1),
    'size-negative': setter(1, 'size', -512, block=1),
    'total-size-float': setter(1, 'total_size', 2097152.0),
    'size-float': setter(1, 'size', 1024.0, block=1),
    'blocks-none': setter(1, 'blocks', None),
    'extra-item': lambda copy: copy.insert(1, 5),
    'device-negative': setter(1, 'device', -1),
    'device-2-70': setter(1, 'device', 2**70),
    'device-str': setter(1, 'device', '0'),
    'requested-size-2-70': setter(1, 'requested_size', 2**70, block=1),
    'requested-size-negative': setter(1, 'requested_size', -5, block=1),
    'requested-size-str': setter(1, 'requested_size', '1000', block=1),
    'size-str': lambda copy: (setter(1, 'size', '1024', block=1)(copy),
                              copy[1]['blocks'][1].pop('requested_size')),
}
for name, change in bad_segment_lists.items():
    files[f'segment-list-{name}.pickle'] = altered(change)
# The dict form with the same values in its segments: refused the same way.
for name in ('requested-size-str', 'device-str', 'total-size-2-70'):
    copy = dict(snapshot, segments=pickle.loads(pickle.dumps(segments)))
    bad_segment_lists[name](copy['segments'])
    files[f'snapshot-segment-{name}.pickle'] = pickle.dumps(copy, protocol=4)

# Device 0 with 16 live blocks of 4 MiB (64 MiB), device 1 with 4 of 25 MiB (100 MiB): the
# device chosen by default is the one with the most live bytes, device 1.
files['segment-list-bytes-over-blocks.pickle'] = pickle.dumps([
    segment(0, 0x7f0000000000, 'large',
            [block(0x7f0000000000 + i * (4 << 20), 4 << 20, 4 << 20, 'active_allocated')
             for i in range(16)]),
    segment(1, 0x7f1000000000, 'large',
            [block(0x7f1000000000 + i * (25 << 20), 25 << 20, 25 << 20, 'active_allocated')
             for i in range(4)]),
], protocol=4)

# Two segment lists in one file (pickle.dump to a file opened 'ab'); a snapshot followed by
# a PROTO and no pickle, by a second snapshot cut short, by a newline and by whitespace; a
# segment list followed by whitespace; an empty list.
files['two-segment-lists.pickle'] = pickle.dumps(segments, protocol=4) * 2
files['snapshot-then-proto-junk.pickle'] = pickle.dumps(snapshot, protocol=4) + b'\x80\x04junk'
files['snapshot-then-cut-pickle.pickle'] = (pickle.dumps(snapshot, protocol=4)
                                            + pickle.dumps(snapshot, protocol=4)[:100])
files['snapshot-then-newline.pickle'] = pickle.dumps(snapshot, protocol=4) + b'\n'
files['segment-list-then-whitespace.pickle'] = pickle.dumps(segments, protocol=4) + b' \r\n\t\n'
files['list-empty.pickle'] = pickle.dumps([], protocol=4)
for name, data in files.items():
    with open(name, 'wb') as f:
        f.write(data)
