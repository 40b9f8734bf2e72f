#!/usr/bin/env bash
# A newcomer's first hour, as a test: clone the repository into an empty
# temporary folder with nothing beside it and run the README's command one
# (scripts/demo.sh) there, to a passing table.
#
# It clones the COMMITTED state (git clone of the repository this test's
# sources come from, at its checked-out commit): uncommitted changes are not
# tested. The repository is found from a runfile that is a source file
# (README.md): readlink -f leads into the source tree, then git rev-parse.
# The inner Bazel gets its own --output_user_root under $TEST_TMPDIR and no
# ~/.bazelrc: a cold build, as on a fresh machine, unless
# HSAP_BAZEL_DISK_CACHE names a Bazel disk cache (command two passes the one
# its plain stage just filled, so the clone's build reuses those actions:
# their keys are content hashes, so a file the commit lacks still fails the
# build, and an uncommitted change is rebuilt from the commit's sources).
# Its server is shut down and its outputs removed at the end, pass or fail.
# Prints how long the clone, the build and the demo took.
set -euo pipefail
readme=$(readlink -f "${TEST_SRCDIR:?run this under bazel test}/hsap/README.md")
repo=$(git -C "$(dirname "$readme")" rev-parse --show-toplevel)
commit=$(git -C "$repo" rev-parse HEAD)
tmp="${TEST_TMPDIR:?}"
root="$tmp/bazel-root"
empty="$tmp/empty"
mkdir -p "$empty" "$tmp/bin"

# `bazel` for command one: its own output root, no user rc file; the disk
# cache, when there is one, through an rc file of its own.
rc=()
if [ -n "${HSAP_BAZEL_DISK_CACHE:-}" ]; then
  echo "build --disk_cache=$HSAP_BAZEL_DISK_CACHE" >"$tmp/disk_cache.bazelrc"
  rc=(--bazelrc="$tmp/disk_cache.bazelrc")
  echo "fresh_clone_test: the inner build reads the disk cache $HSAP_BAZEL_DISK_CACHE"
fi
cat >"$tmp/bin/bazel" <<WRAPPER
#!/bin/sh
exec /usr/bin/bazel --nohome_rc ${rc[*]:-} --output_user_root="$root" "\$@"
WRAPPER
chmod +x "$tmp/bin/bazel"
export PATH="$tmp/bin:$PATH"

cleanup() {
  set +e
  if [ -d "$empty/hsap" ]; then (cd "$empty/hsap" && bazel shutdown >/dev/null 2>&1); fi
  chmod -R u+w "$root" "$empty" 2>/dev/null
  rm -rf "$root" "$empty"
}
trap cleanup EXIT

start=$SECONDS
git clone --quiet --no-hardlinks "$repo" "$empty/hsap"
git -C "$empty/hsap" checkout --quiet "$commit"
[ "$(ls -A "$empty")" = hsap ] || { echo "fresh_clone_test: $empty holds more than the clone" >&2; exit 1; }
echo "fresh_clone_test: cloned $repo at $commit in $((SECONDS - start)) s"

start=$SECONDS
log="$tmp/demo.log"
status=0
(cd "$empty/hsap" && bash scripts/demo.sh) >"$log" 2>&1 || status=$?
echo "fresh_clone_test: command one (build from scratch + demo) took $((SECONDS - start)) s, exit $status"
grep -E "^(strategy|ring|ulysses|usp|sap|hsap|auto) |^CHECK|^demo: hsap_demo took|Elapsed time|processes: " "$log" || true
if [ $status -ne 0 ] || ! grep -q "^CHECK PASSED" "$log"; then
  echo "fresh_clone_test: command one did not pass; its output:" >&2
  tail -n 80 "$log" >&2
  exit 1
fi
for s in ring ulysses usp sap hsap auto; do
  grep -qE "^$s +" "$log" || { echo "fresh_clone_test: no table row for $s" >&2; exit 1; }
done
echo "fresh_clone_test: PASSED"
