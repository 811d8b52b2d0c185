#!/usr/bin/env bash
# Every command in README.md and docs/*.md runs as written from the repository
# root, and every relative link points at a file of the repository.
#
# Commands are the lines of ```bash blocks (with their \ continuations) and
# the inline code spans that start like one (build/attnres, scripts/, mpirun,
# python3); a span with a placeholder (DIR, N, S.json, ..., [opt], a|b) is a
# synopsis and is not run; a command written with a bare `attnres` (not on
# PATH) fails the test. They run in document order (README, then docs/ by
# name) in a copy of the repository whose data and configs are shrunk: a small
# generated corpus in data/brown/ and the shipped configs with tiny widths,
# sequences and token budgets (same keys, layers and residual modes), so that
# a 500-step run takes seconds; `build/attnres bench` gets tiny widths too. The copy starts in the state the README's
# set-up leaves (the quickstart's model trained into ckpt/quickstart).
# Skipped, and said so: the scripts that install packages and build (the
# README's set-up, which this suite is part of), the planted-fault check (CI runs
# it after the suite; its --list runs here), and GPU commands without a GPU.
# ATTNRES_TEST_PART=backend runs only the commands whose outcome depends on the
# build: those naming a GPU config, cuda or NCCL (a build without CUDA refuses
# them). CI runs the whole test on the CPU-only build and this part on the
# build with CUDA; the whole test fails if a build refuses a command that the
# part would not run.
source "$(dirname "$0")/lib.sh"
part="${ATTNRES_TEST_PART:-}"
[[ -z $part || $part == backend ]] || fail "unknown ATTNRES_TEST_PART '$part' (backend, or unset)"
backend_command() { [[ $1 =~ gpu_|cuda|nccl ]]; }

# ---- the commands and links of the docs ----
"$PY" - "$SRC" > commands.txt <<'PYEOF'
import os, re, sys
src = sys.argv[1]
files = ["README.md"] + sorted("docs/" + f for f in os.listdir(os.path.join(src, "docs")) if f.endswith(".md"))
starts = ("build/attnres ", "scripts/", "mpirun ", "python3 ", "/usr/bin/python3 ")
placeholder = re.compile(r"\.\.\.|\[|\||<|\b[A-Z][A-Z0-9_]*\b(?!=)|\b[A-Z]+\.json\b")
bad = []
for f in files:
    text = open(os.path.join(src, f)).read()
    for m in re.finditer(r"\[[^\]]*\]\(([^)\s]+)\)", text):
        target = m.group(1).split("#")[0]
        if target and not re.match(r"[a-z]+:", target):
            path = os.path.normpath(os.path.join(src, os.path.dirname(f), target))
            if not path.startswith(os.path.normpath(src) + os.sep) or not os.path.exists(path):
                bad.append(f"{f}: link to {m.group(1)} does not resolve inside the repository")
    prose, in_bash, cont = [], False, ""
    for line in text.split("\n"):
        if line.startswith("```"):
            in_bash = line.strip() == "```bash"
            prose.append("")
            continue
        if not in_bash:
            prose.append(line)
            continue
        # Drop a trailing comment (no '#' inside our commands' quotes).
        code = re.sub(r"(^|\s)#.*$", "", line).rstrip()
        if code.endswith("\\"):
            cont += code[:-1] + " "
            continue
        code = (cont + code).strip()
        cont = ""
        if code:
            print(f"{f}\t{code}")
    # Inline spans may wrap across lines. A span is a command when it starts
    # like one and has arguments (`scripts/x.sh` alone names a file, `mpirun
    # -np` a flag); mpirun spans must launch build/....
    for span in re.findall(r"`([^`]+)`", "\n".join(prose)):
        span = " ".join(span.split())
        if re.match(r"attnres \S+.*( -|/|\.json)", span):  # an invocation, not a name
            bad.append(f"{f}: `{span}`: write build/attnres (attnres is not on PATH)")
        elif (span.startswith(starts) and " " in span and not placeholder.search(span)
              and (not span.startswith("mpirun ") or " build/" in span)):
            print(f"{f}\t{span}")
for b in bad:
    print(f"BAD\t{b}")
PYEOF
if grep -q "^BAD" commands.txt; then
  grep "^BAD" commands.txt | cut -f2- >&2
  fail "the docs have commands or links that cannot work as written"
fi
pass "$(wc -l < commands.txt) commands found in README.md and docs/, every link resolves"

# The repository stands alone: nothing points at files outside it (the
# specification and background notes it was written from live in docs/).
outside=$(grep -rnE '\.\./shar[e]d|shar[e]d/(spec|research)' --exclude=docs.sh "$SRC"/{README.md,CMakeLists.txt,src,tools,tests,docs,scripts,configs} || true)
[[ -z "$outside" ]] || { echo "$outside" >&2; fail "references to files outside the repository"; }
pass "no reference to files outside the repository"

# ---- the repository copy, in the state the README's set-up leaves ----
mkdir repo && cd repo
cp -r "$SRC/configs" "$SRC/scripts" "$SRC/docs" "$SRC/README.md" .
mkdir -p build data/brown
ln -s "$BIN" build/attnres
ln -s "$(dirname "$BIN")/tests" build/tests
# A corpus with enough distinct words for a 512-token BPE vocabulary.
"$PY" - <<'PYEOF'
import os, random
rng = random.Random(7)
letters = "etaoinshrdlucmfwypvbgkjqxz"
words = ["".join(rng.choice(letters[: rng.randint(8, 26)]) for _ in range(rng.randint(1, 9)))
         for _ in range(3000)]
os.makedirs("corpus", exist_ok=True)
for d in range(40):
    with open(f"corpus/doc{d:02d}.txt", "w") as f:
        for _ in range(60):
            f.write(" ".join(rng.choice(words) for _ in range(rng.randint(5, 15))).capitalize() + ".\n")
PYEOF
build/attnres tokenize train --input corpus --format text --vocab-size 512 \
  --output data/brown/tokenizer.json 2>/dev/null
build/attnres tokenize encode --tokenizer data/brown/tokenizer.json --input corpus --format text \
  --output-dir data/brown --val-fraction 0.1 --name brown 2>/dev/null
# Tiny configs: widths, sequences, batches and budgets shrunk, everything else as shipped.
"$PY" - <<'PYEOF'
import glob, json, re
def shrink(o):
    if isinstance(o, list):
        return [shrink(x) for x in o]
    if not isinstance(o, dict):
        return o
    o = {k: shrink(v) for k, v in o.items()}
    if "d_model" in o:
        o["d_model"] = 4 * o.get("n_heads", 4)          # head dim 4
    if "d_ff" in o:
        o["d_ff"] = 32
    if "vocab_size" in o:
        o["vocab_size"] = 512
    if "seq_len" in o:
        o["seq_len"] = 16
    if "micro_batch_size" in o:
        o["micro_batch_size"] = 2
    if "tokens" in o and isinstance(o["tokens"], list):
        o["tokens"] = [min(t, 4000) + 100 * i for i, t in enumerate(o["tokens"])]
    if "batches" in o:
        o["batches"] = min(o["batches"], 2)
    return o
for path in glob.glob("configs/**/*.json", recursive=True):
    text = open(path).read()
    cfg = json.loads(re.sub(r"^\s*//.*$", "", text, flags=re.M))
    json.dump(shrink(cfg), open(path, "w"), indent=1)
PYEOF
build/attnres train configs/quickstart.json > /dev/null 2> setup.log \
  || { tail -20 setup.log; fail "the quickstart's training (set-up state)"; }
pass "repository copy: tiny corpus ($(ls data/brown/*.bin | wc -l) shards), tiny configs, ckpt/quickstart"

# ---- run them ----
has_gpu() { nvidia-smi -L > /dev/null 2>&1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
unset OMP_NUM_THREADS  # the defaults a user gets (ranks share the cores)
ran=0 skipped=0
tiny_bench="--d-model 32 --layers 2 --heads 4 --kv-heads 2 --d-ff 64 --vocab 512 --seq-len 32 --batch 2 --steps 2"
while IFS=$'\t' read -r doc cmd; do
  [[ $part != backend ]] || backend_command "$cmd" || continue
  reason=""
  case "$cmd" in
    scripts/test.sh*) reason="the test suite itself" ;;
    "scripts/mutants.sh --list"*) ;;
    scripts/mutants.sh*) reason="the planted-fault check: builds its own copy; CI runs it after the suite" ;;
    scripts/quickstart.sh*|scripts/sweep_cpu.sh*|scripts/gpu_deps.sh*)
      reason="installs packages and builds (the README's set-up, run from a fresh clone)" ;;
    scripts/gpu_prebuild.sh*) reason="builds the CUDA binaries for a GPU machine (minutes: the GPU plan's CPU step)" ;;
    *gpu_check.sh*|*gpu_profile.sh*|*gpu_logits_compare.sh*|*"--device cuda"*|*nccl*)
      has_gpu || reason="needs a GPU" ;;
  esac
  if [[ "$cmd" == mpirun* ]] && ! command -v mpirun > /dev/null; then reason="mpirun not installed"; fi
  if [[ -n "$reason" ]]; then
    echo "SKIP: $doc: $cmd ($reason)"
    skipped=$((skipped + 1))
    continue
  fi
  start=$SECONDS
  rc=0
  # The benchmark at tiny widths, as the configs are (its flags before the
  # documented ones, which win): the command's flags and output format are
  # what is checked here, and its built-in shapes took 2 of this test's 3 min.
  run="${cmd/build\/attnres bench/build/attnres bench $tiny_bench}"
  timeout 600 bash -c "$run" > cmd_out.txt 2> cmd_err.txt < /dev/null || rc=$?
  if [[ $rc -ne 0 ]] && grep -q "this build has no CUDA backend" cmd_err.txt; then
    backend_command "$cmd" ||
      fail "$doc: \`$cmd\` needs the CUDA backend, but the backend part would not run it (backend_command)"
    echo "SKIP: $doc: $cmd (this build has no CUDA backend)"
    skipped=$((skipped + 1))
    continue
  fi
  if [[ $rc -ne 0 ]]; then
    tail -n 20 cmd_err.txt cmd_out.txt >&2
    fail "$doc: \`$cmd\` exited $rc"
  fi
  pass "$doc: $cmd ($((SECONDS - start)) s)"
  ran=$((ran + 1))
done < ../commands.txt
if [[ $part == backend && $ran -eq 0 ]]; then
  echo "skipped: every build-dependent command needs what this build or machine lacks ($skipped skipped, each refused as above)"
  exit 77
fi
echo "all documented commands${part:+ of the $part part} ran: $ran run, $skipped skipped"
