# Shared by the GPU scripts (gpu_check.sh, gpu_profile.sh, gpu_logits_compare.sh).

# use_deps: the Debian packages the CPU side needs (json, spdlog, Catch2,
# OpenBLAS, PCRE2, pkg-config) from the system when present; otherwise the
# .deb files of .deps/ (made on a Debian machine by scripts/gpu_deps.sh and
# carried to the GPU machine) unpacked into a fresh /tmp/attnres-deps, with the
# environment to build against them and to run what was built (OpenBLAS's
# own libgfortran is found only through LD_LIBRARY_PATH, not the binary's
# RUNPATH). Before anything is built, every unpacked library the build and
# the binaries load (OpenBLAS, spdlog, fmt, PCRE2, libgfortran, and the
# pkgconf program) must resolve all its dependencies with that
# LD_LIBRARY_PATH: a .deps/ made for another Debian release or missing a
# package fails here, naming the library, not later in the link or at start.
# Sets deps_cmake_args for CMake's configure; returns 1 with a message when
# neither is there or a library does not load.
# For testing on a machine that has the packages: ATTNRES_DEPS_FORCE=1 skips
# the system check (uses .deps/ anyway); ATTNRES_DEPS_PREFIX=DIR unpacks
# there instead of /tmp/attnres-deps (no spaces; the folder is emptied first).
use_deps() {
  deps_cmake_args=()
  local h have=1
  for h in nlohmann/json.hpp catch2/catch.hpp spdlog/spdlog.h pcre2.h x86_64-linux-gnu/cblas.h; do
    [[ -f /usr/include/$h ]] || have=0
  done
  command -v pkg-config >/dev/null || have=0
  [[ ${ATTNRES_DEPS_FORCE:-0} == 1 ]] && have=0
  [[ $have -eq 1 ]] && return 0
  if ! ls .deps/*.deb >/dev/null 2>&1; then
    echo "error: the CPU-side dependencies are missing and .deps/ holds no .deb files" >&2
    echo "       (run scripts/gpu_deps.sh on a Debian machine and carry .deps/)" >&2
    return 1
  fi
  local prefix=${ATTNRES_DEPS_PREFIX:-/tmp/attnres-deps} f
  [[ -n "$prefix" && "$prefix" != / ]] || { echo "error: ATTNRES_DEPS_PREFIX='$prefix'" >&2; return 1; }
  rm -rf "$prefix"  # a fresh folder: nothing left over from another .deps/
  mkdir -p "$prefix"
  for f in .deps/*.deb; do
    dpkg-deb -x "$f" "$prefix" || { echo "error: could not unpack $f" >&2; return 1; }
  done
  local lib="$prefix/usr/lib/x86_64-linux-gnu"
  export CMAKE_PREFIX_PATH="$prefix/usr"
  export LD_LIBRARY_PATH="$lib:$lib/openblas-openmp:${LD_LIBRARY_PATH:-}"
  # PCRE2 is found through pkg-config: the unpacked pkgconf, reading only the
  # unpacked .pc files, with their /usr paths moved under the prefix.
  export PKG_CONFIG_LIBDIR="$lib/pkgconfig" PKG_CONFIG_SYSROOT_DIR="$prefix"
  deps_check_libs "$prefix" || return 1
  deps_cmake_args=("-DATTNRES_BLAS_INCLUDE_DIR=$prefix/usr/include/x86_64-linux-gnu/openblas-openmp"
                   "-DATTNRES_BLAS_LIBRARY=$lib/openblas-openmp/libopenblas.so"
                   "-DPKG_CONFIG_EXECUTABLE=$prefix/usr/bin/pkgconf")
}

# deps_check_libs PREFIX: each library of .deps/ unpacked under PREFIX that
# the build and the binaries need is there and resolves every dependency
# (`ldd` with the current LD_LIBRARY_PATH shows no "not found", which also
# catches a missing GLIBC_x.y version; without ldd, python3's ctypes loads
# it). libfmt is checked when it was unpacked (spdlog may bundle it). Returns
# 1 with a message naming the library otherwise.
deps_check_libs() {
  local lib="$1/usr/lib/x86_64-linux-gnu" name f out bad=0 load=0
  local required=(openblas-openmp/libopenblas.so libspdlog.so libpcre2-8.so libgfortran.so.5
                  ../../bin/pkgconf)
  local names=("${required[@]}")
  [[ -e "$lib/libfmt.so" ]] && names+=(libfmt.so)
  for name in "${names[@]}"; do
    f="$lib/$name"
    if [[ ! -e "$f" ]]; then
      echo "error: ${name##*/} is not in .deps/ (unpacked into $1): rerun scripts/gpu_deps.sh" >&2
      bad=1
      continue
    fi
    if command -v ldd >/dev/null; then
      out=$(ldd "$f" 2>&1) && ! grep -q "not found" <<<"$out" && continue
      echo "error: ${name##*/} from .deps/ does not load here (LD_LIBRARY_PATH=$LD_LIBRARY_PATH):" >&2
      grep -E "not found|not a dynamic|error" <<<"$out" | sed 's/^/       /' >&2
    elif [[ $name == *.so* ]] && command -v python3 >/dev/null; then
      out=$(python3 -c 'import ctypes, sys; ctypes.CDLL(sys.argv[1])' "$f" 2>&1) && continue
      echo "error: ${name##*/} from .deps/ does not load here: ${out##*$'\n'}" >&2
    else
      continue  # neither ldd nor python3: the build will tell
    fi
    bad=1 load=1
  done
  [[ $load -eq 0 ]] || echo "       (make .deps/ with scripts/gpu_deps.sh on a Debian release whose glibc is not newer than this machine's)" >&2
  return $bad
}

# mpi_launcher_flags [MPIRUN]: the launcher flags of the multi-rank tests,
# printed on one line: --oversubscribe (more ranks than cores or GPUs) and,
# as root, --allow-run-as-root, both only when MPIRUN (default mpirun) is
# Open MPI (`--version` names "Open MPI" or "OpenRTE"); MPICH and others take
# neither, and get nothing. tests/CMakeLists.txt does the same for CTest.
mpi_launcher_flags() {
  local v flags=()
  v=$("${1:-mpirun}" --version 2>&1) || true
  if grep -qE "Open MPI|OpenRTE" <<<"$v"; then
    flags+=(--oversubscribe)
    [[ $(id -u) == 0 ]] && flags+=(--allow-run-as-root)
  fi
  echo "${flags[*]}"
}

# build_targets DIR: the targets scripts/gpu_check.sh's stages run, for a
# configured build folder DIR: attnres and test_gpu, and test_mpi when mpirun
# is on PATH and CMake found MPI (DIR registered the mpi tests); says on
# stderr why test_mpi is left out.
build_targets() {
  local t="attnres test_gpu"
  if ! command -v mpirun >/dev/null; then
    echo "note: no mpirun on PATH: test_mpi is not built (--multi cannot run)" >&2
  elif grep -q "test_mpi" "$1/tests/CTestTestfile.cmake" 2>/dev/null; then
    t+=" test_mpi"
  else
    echo "note: CMake found no MPI: test_mpi is not built (--multi cannot run)" >&2
  fi
  echo "$t"
}

# pack_to_out NAME DIR: when $OUT is set (the device tool's folder, which
# returns at most 8 files), DIR's contents as $OUT/NAME.tgz, written whole and
# then renamed, so a command stopped mid-way still leaves the last complete
# archive. Unpacking every archive of a session into one folder gives
# scripts/gpu_report.py its input.
pack_to_out() {
  [[ -n "${OUT:-}" ]] || return 0
  tar czf "$OUT/$1.tgz.part" -C "$2" . && mv "$OUT/$1.tgz.part" "$OUT/$1.tgz"
}

# tree_stamp: one sha256 over the sources the GPU binaries are built from
# (src/, tools/, tests/ and the CMake files: names and contents, in a fixed
# order), so a binary built on another machine from the same tree is known to
# be this tree's. The device gets a copy of the working tree, without .git.
tree_stamp() {
  find src tools tests CMakeLists.txt -type f ! -name '*.pyc' -print0 | LC_ALL=C sort -z \
    | xargs -0 sha256sum | sha256sum | cut -d' ' -f1
}

# The binaries the stages run, relative to build-gpu/ (test_mpi only where
# mpirun is: build_targets).
GPU_BINARIES=(attnres tests/test_gpu tests/test_mpi)

# binaries_load: every binary there (test_mpi may be absent without mpirun)
# finds each library it loads (`ldd`, with use_deps's LD_LIBRARY_PATH); says
# which does not.
binaries_load() {
  local b out bad=0
  for b in "${GPU_BINARIES[@]}"; do
    if [[ ! -x build-gpu/$b ]]; then
      [[ $b == tests/test_mpi ]] && ! command -v mpirun >/dev/null && continue
      echo "build-gpu/$b is missing"; bad=1; continue
    fi
    out=$(ldd "build-gpu/$b" 2>&1) || { echo "ldd build-gpu/$b failed: $out"; bad=1; continue; }
    if grep -q "not found" <<<"$out"; then
      echo "build-gpu/$b: $(grep "not found" <<<"$out" | tr -s ' \t\n' ' ')"
      bad=1
    fi
  done
  return $bad
}

# gpu_binaries: build-gpu/'s binaries for this tree, the cheapest way: as they
# are when a build of this tree left them (build-gpu/stamp.txt), else the
# prebuilt ones of .gpu-prebuilt.tar.xz (scripts/gpu_prebuild.sh on the CPU
# machine) when their stamp is this tree's and ldd finds every library, else
# configured and built here (Release, sm_90; ~1.6 min on an H100 machine).
gpu_binaries() {
  local want have
  want=$(tree_stamp)
  if [[ -f build-gpu/stamp.txt && $(< build-gpu/stamp.txt) == "$want" ]] && binaries_load; then
    echo "binaries: built from this tree ($want), already here"
    return 0
  fi
  if [[ -f .gpu-prebuilt.tar.xz ]]; then
    have=$(tar xJOf .gpu-prebuilt.tar.xz stamp.txt 2>/dev/null)
    if [[ $have != "$want" ]]; then
      echo "binaries: .gpu-prebuilt.tar.xz was built from another tree (stamp ${have:-none}, this tree $want): building"
    else
      mkdir -p build-gpu
      tar xJf .gpu-prebuilt.tar.xz -C build-gpu || return 1
      if binaries_load; then
        echo "binaries: prebuilt from this tree ($want), every library found:"
        (cd build-gpu && du -b "${GPU_BINARIES[@]}" 2>/dev/null)
        return 0
      fi
      echo "binaries: the prebuilt ones do not load here (above): building"
    fi
  else
    echo "binaries: no .gpu-prebuilt.tar.xz: building"
  fi
  rm -f build-gpu/stamp.txt
  # shellcheck disable=SC2086  # DEPS_CMAKE_ARGS: words, from use_deps
  cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 $DEPS_CMAKE_ARGS \
    && cmake --build build-gpu -j"$(nproc)" --target $(build_targets build-gpu) || return 1
  echo "$want" > build-gpu/stamp.txt
  binaries_load
}
