#!/usr/bin/env bash
# Did a CUDA refactor change the machine code? Dumps every kernel of some
# compiled objects (the sm_90 cubins inside their fat binaries) as normalised
# SASS plus its resources, and compares two such dumps kernel by kernel.
#   scripts/sass_diff.sh dump DIR OBJ...   per-kernel SASS and DIR/index.tsv
#   scripts/sass_diff.sh diff BEFORE AFTER  one verdict per kernel; exit 1 if any CHANGED
#   scripts/sass_diff.sh fetch-nvdisasm     nvdisasm into .deps/nvdisasm (see below)
# Typical use (objects of the build dir, before and after the edit):
#   o=build/src/CMakeFiles/attnres_kernels.dir/kernels/cuda
#   scripts/sass_diff.sh dump /tmp/before $o/attention*.o
#   (edit, rebuild)
#   scripts/sass_diff.sh dump /tmp/after $o/attention*.o
#   scripts/sass_diff.sh diff /tmp/before /tmp/after
# Kernels are keyed by their demangled names without "(anonymous namespace)::"
# and the private helper namespaces (attn::, mix::), so code may move between
# files and namespaces. Listings drop offsets and encodings, number labels per
# kernel and write the kernel's own name as KERNEL.
# index.tsv: registers, static shared memory (with the 1 KiB sm_90 reserves),
# const bank 0, frame and stack (min/max) bytes, instruction count, hashes of
# the .text bytes, of .nv.info and of the relocations.
# Verdicts: identical (same .text bytes, listing and resources); same-seq (same
# resources, the same instructions in the same order, only register numbers
# differ: a register allocation change); same-ops (same resources and opcode
# multiset, another order); CHANGED (resources or instructions differ: opcode
# deltas are printed).
# Disassembler: $NVDISASM, else nvdisasm on PATH or in /usr/local/cuda/bin,
# else .deps/nvdisasm. The CUDA toolkit of the dev machines ships no nvdisasm;
# fetch-nvdisasm downloads Debian's nvidia-cuda-toolkit 11.8 package (non-free,
# ~84 MB, with apt-get download and a private sources list: nothing is
# installed) and unpacks its nvdisasm. That nvdisasm does not know the ELF
# header of CUDA 13 cubins (ABI 8); it is given an ABI 7 header with the same
# sm_90 flags, which leaves the code sections as they are.
set -euo pipefail
cd "$(dirname "$0")/.."
usage() { sed -n '2,8p' "$0" >&2; exit 2; }
[[ $# -ge 1 ]] || usage

if [[ $1 == fetch-nvdisasm ]]; then
  dir=.deps/nvdisasm apt=.deps/nvdisasm/apt
  mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial"
  echo "deb http://deb.debian.org/debian bookworm non-free" > "$apt/sources.list"
  opts=(-o Dir::Etc::sourcelist="$PWD/$apt/sources.list" -o Dir::Etc::sourceparts=/nonexistent
        -o Dir::State::Lists="$PWD/$apt/lists" -o Dir::Cache="$PWD/$apt/cache")
  apt-get "${opts[@]}" update >/dev/null
  (cd "$apt" && apt-get "${opts[@]}" download nvidia-cuda-toolkit >/dev/null 2>&1)
  dpkg-deb -x "$apt"/nvidia-cuda-toolkit_*.deb "$dir/root"
  rm -rf "$apt"
  echo "$dir/root/usr/bin/nvdisasm"
  exit 0
fi

if [[ $1 == dump ]]; then
  [[ $# -ge 3 ]] || usage
  if [[ -z ${NVDISASM:-} ]]; then
    for c in "$(command -v nvdisasm || true)" /usr/local/cuda/bin/nvdisasm \
             .deps/nvdisasm/root/usr/bin/nvdisasm; do
      [[ -n $c && -x $c ]] && { NVDISASM=$c; break; }
    done
  fi
  [[ -n ${NVDISASM:-} ]] || { echo "no nvdisasm: set NVDISASM or run $0 fetch-nvdisasm" >&2; exit 1; }
  export NVDISASM
elif [[ $1 != diff || $# -ne 3 ]]; then
  usage
fi

exec python3 - "$@" <<'PY'
import collections, hashlib, os, re, struct, subprocess, sys

def sections(elf):
    shoff = struct.unpack_from('<Q', elf, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from('<HHH', elf, 0x3A)
    raw = [struct.unpack_from('<IIQQQQIIQQ', elf, shoff + i * shentsize) for i in range(shnum)]
    stroff = raw[shstrndx][4]
    name = lambda n: elf[stroff + n:elf.index(b'\0', stroff + n)].decode()
    return [dict(name=name(r[0]), type=r[1], off=r[4], size=r[5], link=r[6], entsize=r[9])
            for r in raw]

def cubins(obj):
    """The ELF images inside the host object's .nv_fatbin section."""
    data = open(obj, 'rb').read()
    fb = [s for s in sections(data) if s['name'] == '.nv_fatbin']
    if not fb:
        return []
    blob = data[fb[0]['off']:fb[0]['off'] + fb[0]['size']]
    out, i = [], blob.find(b'\x7fELF')
    while i >= 0:
        phoff, shoff = struct.unpack_from('<QQ', blob, i + 0x20)
        phentsize, phnum, shentsize, shnum = struct.unpack_from('<HHHH', blob, i + 0x36)
        end = i + max(shoff + shentsize * shnum, phoff + phentsize * phnum)
        out.append(bytes(blob[i:end]))
        i = blob.find(b'\x7fELF', end)
    return out

def symbols(elf, secs):
    st = [s for s in secs if s['type'] == 2][0]
    strs = secs[st['link']]['off']
    names = []
    for k in range(st['size'] // 24):
        n = struct.unpack_from('<I', elf, st['off'] + 24 * k)[0]
        names.append(elf[strs + n:elf.index(b'\0', strs + n)].decode())
    return names

_canon = {}
def canon(mangled):
    if mangled not in _canon:
        d = subprocess.run(['c++filt'], input=mangled, capture_output=True, text=True).stdout.strip()
        for ns in ('(anonymous namespace)::', 'attn::', 'mix::'):
            d = d.replace(ns, '')
        _canon[mangled] = d
    return _canon[mangled]

def fname(key):
    return hashlib.sha1(key.encode()).hexdigest()[:16] + '.sass'

def sha(b):
    return hashlib.sha1(b if isinstance(b, bytes) else b.encode()).hexdigest()[:12]

def disassemble(cub, tmp):
    for patch in (False, True):
        b = bytearray(cub)
        if patch:  # CUDA 13 header (ABI 8) -> the ABI 7 form older nvdisasm reads
            b[7], b[8] = 0x33, 7
            struct.pack_into('<I', b, 0x30, 0x5a055a)
        open(tmp, 'wb').write(b)
        r = subprocess.run([os.environ['NVDISASM'], '-c', tmp], capture_output=True, text=True)
        os.unlink(tmp)
        if r.returncode == 0:
            return r.stdout
        if patch or b[8] != 8:
            sys.exit('nvdisasm failed: ' + r.stderr.strip())

def dump(outdir, objs):
    os.makedirs(outdir, exist_ok=True)
    rows = []
    for obj in objs:
        for cub in cubins(obj):
            secs = sections(cub)
            syms = symbols(cub, secs)
            by = {s['name']: s for s in secs}
            body = lambda s: cub[s['off']:s['off'] + s['size']] if s else b''
            attrs = {}  # global .nv.info: REGCOUNT 0x2f, FRAME_SIZE 0x11, MIN/MAX_STACK 0x12/0x23
            gi = by.get('.nv.info')
            p, end = (gi['off'], gi['off'] + gi['size']) if gi else (0, 0)
            while p < end:
                fmt, at = cub[p], cub[p + 1]
                if fmt != 4:
                    p += 4
                    continue
                size = struct.unpack_from('<H', cub, p + 2)[0]
                if at in (0x2f, 0x11, 0x12, 0x23) and size == 8:
                    sym, v = struct.unpack_from('<II', cub, p + 4)
                    attrs.setdefault(syms[sym], {})[at] = v
                p += 4 + size
            listing = disassemble(cub, os.path.join(outdir, '.tmp.cubin'))
            parts = re.split(r'^//-+ (\.text\.\S+)\s+-+\n', listing, flags=re.M)
            for name, text in zip(parts[1::2], parts[2::2]):
                kern = name[len('.text.'):]
                key = canon(kern)
                rel = by.get('.rel.text.' + kern) or by.get('.rela.text.' + kern)
                rels = ''
                if rel:
                    ent = rel['entsize'] or 16
                    for k in range(rel['size'] // ent):
                        off, info = struct.unpack_from('<QQ', cub, rel['off'] + ent * k)
                        rels += f'{off:x} {info & 0xffffffff} {canon(syms[info >> 32])}\n'
                labels, lines = {}, []
                text = re.split(r'^//-+', text, flags=re.M)[0]
                for ln in text.splitlines():
                    ln = re.sub(r'/\*[0-9a-f]{4,}\*/', '', ln)
                    ln = re.sub(r'\.L_x_\d+', lambda m: labels.setdefault(m.group(0), f'.L{len(labels)}'), ln)
                    ln = ln.replace(kern, 'KERNEL')
                    ln = re.sub(r'\$__internal_\d+_\$', '$__internal_N_$', ln).strip()
                    if ln:
                        lines.append(ln)
                ninstr = sum(1 for ln in text.splitlines() if re.match(r'\s+/\*[0-9a-f]{4,}\*/', ln))
                open(os.path.join(outdir, fname(key)), 'w').write('\n'.join(lines) + '\n')
                a = attrs.get(kern, {})
                rows.append((key, a.get(0x2f), by.get('.nv.shared.' + kern, {}).get('size', 0),
                             by.get('.nv.constant0.' + kern, {}).get('size', 0), a.get(0x11, 0),
                             f'{a.get(0x12, 0)}/{a.get(0x23, 0)}', ninstr,
                             sha(body(by[name])), sha(body(by.get('.nv.info.' + kern))), sha(rels),
                             os.path.basename(obj)))
    rows.sort()
    with open(os.path.join(outdir, 'index.tsv'), 'w') as f:
        f.write('kernel\tregs\tshared\tconst0\tframe\tstack\tninstr\ttext_sha\tinfo_sha\trel_sha\tobject\n')
        for r in rows:
            f.write('\t'.join(map(str, r)) + '\n')
    print(len(rows), 'kernels in', outdir)

def diff(a, b):
    def load(d):
        rows = [l.rstrip('\n').split('\t') for l in open(os.path.join(d, 'index.tsv'))]
        return {r[0]: dict(zip(rows[0], r)) for r in rows[1:]}
    read = lambda d, k: open(os.path.join(d, fname(k))).read()
    def ops(d, k):
        return [re.sub(r'^@!?U?P\w+\s+', '', l).split()[0].rstrip(';') for l in read(d, k).splitlines()
                if not l.startswith('.') and not l.endswith(':')]
    masked = lambda d, k: re.sub(r'\b(U?R|U?P)\d+\b', r'\1#', read(d, k))
    A, B = load(a), load(b)
    counts = collections.Counter()
    for k in sorted(set(A) | set(B)):
        if k not in A or k not in B:
            print('ONLY', 'BEFORE' if k in A else 'AFTER', k)
            counts['CHANGED'] += 1
            continue
        x, y = A[k], B[k]
        res = [f for f in ('regs', 'shared', 'const0', 'frame', 'stack') if x[f] != y[f]]
        if not res and read(a, k) == read(b, k) and x['text_sha'] == y['text_sha'] and x['rel_sha'] == y['rel_sha']:
            verdict = 'identical'
        elif not res and masked(a, k) == masked(b, k):
            verdict = 'same-seq'
        elif not res and collections.Counter(ops(a, k)) == collections.Counter(ops(b, k)):
            verdict = 'same-ops'
        else:
            verdict = 'CHANGED'
        counts[verdict] += 1
        if verdict != 'identical':
            extra = ' '.join(f'{f} {x[f]}->{y[f]}' for f in res)
            print(f"{verdict:9} instructions {x['ninstr']}->{y['ninstr']} {extra} {k}")
            if verdict == 'CHANGED':
                ca, cb = collections.Counter(ops(a, k)), collections.Counter(ops(b, k))
                print('          opcode deltas:', {o: cb[o] - ca[o] for o in sorted(set(ca) | set(cb)) if ca[o] != cb[o]})
    print(dict(counts))
    return 1 if counts['CHANGED'] else 0

if sys.argv[1] == 'dump':
    dump(sys.argv[2], sys.argv[3:])
else:
    sys.exit(diff(sys.argv[2], sys.argv[3]))
PY
