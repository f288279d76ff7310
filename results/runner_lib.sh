# Shared by the resumable background runners (results/*/run.sh); source it, with PY set.
# A runner trains into a run root outside the repository and archives finished members into
# the repository (cbert_jax.report.archive, no checkpoints).

# restore_archived OUT ROOT: members archived under OUT come back into ROOT as done, so the sweep
# runner skips them and trains only what is missing (on this machine or a fresh one).
restore_archived() {
  local out=$1 root=$2 d
  mkdir -p "$root"
  for d in "$out"/*/; do
    [ -f "$d/config.json" ] && [ ! -e "$root/$(basename "$d")" ] && cp -r "$d" "$root/"
  done
}

# archive ROOT OUT: archive ROOT's finished members into OUT (log in ROOT/archive.log).
archive() {
  $PY -m cbert_jax.report.archive --root "$1" --out "$2" >> "$1/archive.log" 2>&1
}

# start_archiver ROOT OUT: archive every 5 minutes in the background; its pid in ARCHIVER.
start_archiver() {
  ( while sleep 300; do archive "$1" "$2"; done ) &
  ARCHIVER=$!
}
