# Shared by the GPU scripts (gpu_check.sh, gpu_profile.sh, gpu_logits_compare.sh).

# pack_to_out NAME DIR: when $OUT is set (the device tool's folder, which
# returns at most 8 files), DIR's contents as $OUT/NAME.tgz, written whole and
# then renamed, so a command stopped mid-way still leaves the last complete
# archive. Unpacking every archive of a session into one folder gives
# scripts/gpu_report.py its input.
pack_to_out() {
  [[ -n "${OUT:-}" ]] || return 0
  tar czf "$OUT/$1.tgz.part" -C "$2" . && mv "$OUT/$1.tgz.part" "$OUT/$1.tgz"
}
