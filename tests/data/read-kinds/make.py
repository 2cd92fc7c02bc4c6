#!/usr/bin/env python3
"""Writes the files of tests/suite/read_kinds.rs: traces as people hand them over, made by
Python's own csv and gzip modules (the independent oracle of what each file holds), not by
portalloc. Deterministic: gzip with mtime=0, rows fixed. Standard library only. Run from
this directory: python3 make.py

* CSVs cut short inside their last row (a lifetime CSV's size of 12582912 cut to 125, an RMM
  log's stream handle 0x7f3a2c001000 to 0x7f3a), beside the same rows whole, gzip'd or not;
* a trace gzip'd twice (gzip.compress(gzip.compress(...))), and three times;
* an XLA dump gzip'd (`gzip -r DIR`): tests/data/xla/mlp_train's files, and a directory where
  the largest module is the gzip'd one, beside a small plain module.
"""
import csv
import gzip
import io
import os
import shutil

HERE = os.path.dirname(os.path.abspath(__file__))
XLA = os.path.join(HERE, '..', 'xla', 'mlp_train')
MODULE = 'module_0030.jit_train_step.cpu_after_optimizations'

# The size the cut rows end with: 12 MiB, cut to its first three digits.
BIG = 12582912
CUT_TO = len('125')


def csv_text(header, rows, lineterminator='\n'):
    """The rows as csv.writer writes them, one '\\n' after each (RMM and SOMAS write '\\n'),
    or '\\r\\n' (csv.writer's own default, and Windows')."""
    out = io.StringIO()
    w = csv.writer(out, lineterminator=lineterminator)
    w.writerow(header)
    w.writerows(rows)
    return out.getvalue().encode()


def cut_in_last_number(text, number=BIG, keep=CUT_TO):
    """`text` (ending with `number` and a line end) cut inside it, `keep` characters kept: no
    line end, the number short."""
    at = text.rindex(str(number).encode())
    assert text[at:] in (str(number).encode() + b'\n', str(number).encode() + b'\r\n')
    return text[:at + keep]


def gz(data):
    return gzip.compress(data, mtime=0)


def write(name, data):
    path = os.path.join(HERE, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'wb') as f:
        f.write(data)


lifetimes = csv_text(['id', 'lower', 'upper', 'size'],
                     [[1, 0, 2, 4096], [2, 1, 3, 8192], [3, 2, 4, BIG]])
# RMM's log ends its rows with the Stream column: a cut in the last row cuts the stream's
# handle (0x7f3a2c001000 to 0x7f3a), read as another stream.
STREAM = '0x7f3a2c001000'
rmm = csv_text(['Thread', 'Time', 'Action', 'Pointer', 'Size', 'Stream'],
               [[1, '00:00:01.000000', 'allocate', '0x10000', 4096, STREAM],
                [1, '00:00:02.000000', 'allocate', '0x20000', 8192, STREAM],
                [1, '00:00:03.000000', 'free', '0x10000', 4096, STREAM],
                [1, '00:00:04.000000', 'allocate', '0x30000', BIG, STREAM]])
rmm_cut = cut_in_last_number(rmm, STREAM, len('0x7f3a'))
assert lifetimes.endswith(b'\n') and rmm.endswith(b'\n')
# The same, as csv.writer writes by default: CRLF. Lines are counted as an editor shows them.
LIFETIMES_ROWS = [[1, 0, 2, 4096], [2, 1, 3, 8192], [3, 2, 4, BIG]]
lifetimes_crlf = csv_text(['id', 'lower', 'upper', 'size'], LIFETIMES_ROWS, '\r\n')
rmm_crlf = csv_text(['Thread', 'Time', 'Action', 'Pointer', 'Size', 'Stream'],
                    [[1, '00:00:01.000000', 'allocate', '0x10000', 4096, STREAM],
                     [1, '00:00:02.000000', 'free', '0x50000', 4096, STREAM],
                     [1, '00:00:03.000000', 'free', '0x10000', 4096, STREAM],
                     [1, '00:00:04.000000', 'allocate', '0x30000', BIG, STREAM]], '\r\n')
assert lifetimes_crlf.endswith(b'\r\n') and b'\r\n' in rmm_crlf

files = {
    'lifetimes-whole.csv': lifetimes,
    'lifetimes-cut.csv': cut_in_last_number(lifetimes),
    'rmm-whole.csv': rmm,
    'rmm-cut.csv': rmm_cut,
    # Read through the spool `portalloc replay` inflates a streaming trace into.
    'rmm-cut.csv.gz': gz(rmm_cut),
    # The whole log, gzip'd twice and three times.
    'rmm-whole.csv.gz.gz': gz(gz(rmm)),
    'rmm-whole.csv.gz.gz.gz': gz(gz(gz(rmm))),
    'lifetimes-whole.csv.gz.gz': gz(gz(lifetimes)),
    # CRLF: a lifetime CSV cut in its last row (line 4), and an RMM log whose line 3 frees
    # an address never allocated, cut in its last row (line 5).
    'lifetimes-crlf-cut.csv': cut_in_last_number(lifetimes_crlf),
    'rmm-crlf-cut.csv': cut_in_last_number(rmm_crlf, STREAM, len('0x7f3a')),
}
for name, data in files.items():
    write(name, data)

# An XLA dump gzip'd whole (`gzip -r`): every file of mlp_train, gzip'd.
for suffix in ('-buffer-assignment.txt', '-live-range.txt'):
    with open(os.path.join(XLA, MODULE + suffix), 'rb') as f:
        data = f.read()
    write(os.path.join('xla-gz', MODULE + suffix + '.gz'), gz(data))
    if suffix == '-buffer-assignment.txt':
        # The largest module gzip'd, beside a small one left plain: the gzip'd one is the
        # dump's largest, which a reader of plain files only would not see.
        write(os.path.join('xla-mixed', MODULE + suffix + '.gz'), gz(data))
small = (b'BufferAssignment:\n'
         b'allocation 0: size 64, parameter 0, shape |f32[16]| at ShapeIndex {}:\n'
         b' value: <1 p0 @0> (size=64,offset=0): f32[16]{0}\n')
write(os.path.join('xla-mixed',
                   'module_0001.jit_small.cpu_after_optimizations-buffer-assignment.txt'),
      small)
