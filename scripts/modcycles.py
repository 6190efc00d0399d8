#!/usr/bin/env python3
"""Import circles among the file modules of one crate.

usage: scripts/modcycles.py CRATE/src [--edges]

A look at the module graph by regular expressions over the source, not a compiler:
it reads `use` trees and `crate::`/`super::`/`self::` paths, and misses imports made
any other way (macros, glob re-exports through another crate). `--edges` prints each
edge with the path that made it, to check a finding by eye.

A file module is every .rs file under src (lib.rs/main.rs = crate, x/mod.rs = x).
An edge A -> B is a path in A's non-test code (use crate::..., super::..., self::...,
or a bare crate:: path) that names B or something inside B. A parent's `mod child;`
and its `pub use` of its own descendants are not edges (they are the module tree, not
a dependency). Test code (`#[cfg(test)]` items to the end of file, files named tests.rs
or under tests/) is left out. Prints each strongly connected component of size > 1.
"""
import os, re, sys
from collections import defaultdict

root = sys.argv[1].rstrip('/')
show_edges = '--edges' in sys.argv

def modpath(f):
    rel = os.path.relpath(f, root)[:-3].split(os.sep)
    if rel[-1] in ('lib', 'main'):
        rel = rel[:-1]
    elif rel[-1] == 'mod':
        rel = rel[:-1]
    return tuple(rel)

files = {}
for d, _, fs in os.walk(root):
    for f in fs:
        if f.endswith('.rs'):
            p = os.path.join(d, f)
            mp = modpath(p)
            if 'tests' in mp or (mp and mp[-1].endswith('tests')):
                continue
            files[mp] = p

# #[path = "..."] module declarations map a module name to another file.
for mp, p in list(files.items()):
    for m in re.finditer(r'#\[path\s*=\s*"([^"]+)"\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)', open(p).read()):
        target = os.path.normpath(os.path.join(os.path.dirname(p), m.group(1)))
        for k, v in list(files.items()):
            if os.path.normpath(v) == target:
                files[mp + (m.group(2),)] = v
                del files[k]

def strip(src):
    # drop comments and strings, and everything from the first #[cfg(test)]
    i = src.find('#[cfg(test)]')
    if i >= 0:
        src = src[:i]
    src = re.sub(r'//[^\n]*', '', src)
    src = re.sub(r'/\*.*?\*/', '', src, flags=re.S)
    src = re.sub(r'"(?:\\.|[^"\\])*"', '""', src)
    return src

def resolve(cur, segs):
    """cur: module path of the file; segs: path segments starting crate/super/self."""
    base = list(cur)
    out = []
    i = 0
    if segs[0] == 'crate':
        base = []
        i = 1
    else:
        while i < len(segs) and segs[i] in ('super', 'self'):
            if segs[i] == 'super':
                base = base[:-1]
            i += 1
    full = tuple(base + segs[i:])
    # longest prefix that is a file module
    for n in range(len(full), -1, -1):
        if full[:n] in files:
            return full[:n]
    return ()

def expand_use(tree):
    """Expand a use tree like crate::a::{b::{C, D}, e} into paths."""
    tree = re.sub(r'\s+as\s+\w+', '', tree)
    tree = re.sub(r'\s+', '', tree)
    def rec(prefix, t):
        if '{' not in t:
            for part in t.split(','):
                if part:
                    yield prefix + [s for s in part.split('::') if s]
            return
        # split top-level commas
        j = t.find('{')
        head = [s for s in t[:j].split('::') if s]
        body = t[j + 1:t.rfind('}')]
        depth, start, parts = 0, 0, []
        for k, c in enumerate(body):
            if c == '{': depth += 1
            elif c == '}': depth -= 1
            elif c == ',' and depth == 0:
                parts.append(body[start:k]); start = k + 1
        parts.append(body[start:])
        for p in parts:
            if p:
                yield from rec(prefix + head, p)
    return list(rec([], tree))

edges = defaultdict(set)
why = {}
for mp, p in files.items():
    src = strip(open(p).read())
    for m in re.finditer(r'(pub(?:\([^)]*\))?\s+)?use\s+((?:crate|super|self)::[^;]+);', src):
        is_pub = bool(m.group(1))
        for segs in expand_use(m.group(2)):
            t = resolve(mp, [s for s in segs if s != '*'])
            if t == mp or t == ():
                continue
            if is_pub and t[:len(mp)] == mp:
                continue  # a parent re-exporting its own descendant
            edges[mp].add(t); why.setdefault((mp, t), m.group(0)[:90])
    body = re.sub(r'(pub(?:\([^)]*\))?\s+)?use\s+[^;]+;', '', src)
    for m in re.finditer(r'\b((?:crate|super|self)(?:::\w+)+)', body):
        t = resolve(mp, m.group(1).split('::'))
        if t != mp and t != ():
            edges[mp].add(t); why.setdefault((mp, t), m.group(1))

def name(m): return '::'.join(m) or 'crate'

idx, low, st, on, sccs, counter = {}, {}, [], set(), [], [0]
sys.setrecursionlimit(10000)
def sc(v):
    idx[v] = low[v] = counter[0]; counter[0] += 1; st.append(v); on.add(v)
    for w in edges.get(v, ()):
        if w == (): continue
        if w not in idx:
            sc(w); low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], idx[w])
    if low[v] == idx[v]:
        comp = []
        while True:
            w = st.pop(); on.discard(w); comp.append(w)
            if w == v: break
        if len(comp) > 1: sccs.append(comp)
for v in list(files):
    if v not in idx and v != ():
        sc(v)
if show_edges:
    for a in sorted(edges):
        for b in sorted(edges[a]):
            print(f'{name(a)} -> {name(b)}    ({why.get((a,b),"")})')
if not sccs:
    print(f'no import circle among {len(files)} file modules of {root}')
for c in sccs:
    print('circle:', ', '.join(sorted(name(m) for m in c)))
    for a in c:
        for b in edges.get(a, ()):
            if b in c:
                print(f'   {name(a)} -> {name(b)}    ({why.get((a,b),"")})')
sys.exit(1 if sccs else 0)
