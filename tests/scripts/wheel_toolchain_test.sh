#!/usr/bin/env bash
# scripts/wheel-toolchain's rules for the directory it is given, checked without building
# anything: a directory it did not make is refused and left as it was; with --cache (the
# default location, cubist's own) what stands there is replaced. A python3 that fails
# stops the script right after it has emptied and marked the directory.
set -euo pipefail
script=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

rc=0; "$script" >"$tmp/out" 2>&1 || rc=$?
((rc == 2)) || fail "no DIR: exit $rc, want 2"
grep -q '^usage: wheel-toolchain \[--cache\] DIR$' "$tmp/out" || fail "no usage line: $(cat "$tmp/out")"

# A toolchain directory of an earlier version: a done file, no marker.
foreign=$tmp/foreign
mkdir -p "$foreign/bin"
echo "abseil-20220623.1 openssl-3.0.20 0.17.1 x86_64-linux-gnu.2.28" >"$foreign/done"
echo keep >"$foreign/bin/zcc"
rc=0; "$script" "$foreign" >"$tmp/out" 2>&1 || rc=$?
((rc == 1)) || fail "foreign DIR: exit $rc, want 1"
grep -qF "wheel-toolchain: $foreign is not empty and not a toolchain this script made; give an empty or new directory (CUBIST_WHEEL_TOOLCHAIN)" "$tmp/out" ||
  fail "foreign DIR: $(cat "$tmp/out")"
[[ $(cat "$foreign/bin/zcc") == keep && -f $foreign/done && ! -e $foreign/.cubist-wheel-toolchain ]] ||
  fail "foreign DIR was changed"

mkdir -p "$tmp/fakebin"
printf '#!/bin/sh\nexit 3\n' >"$tmp/fakebin/python3"
chmod +x "$tmp/fakebin/python3"
rc=0; PATH=$tmp/fakebin:$PATH "$script" --cache "$foreign" >"$tmp/out" 2>&1 || rc=$?
((rc == 3)) || fail "--cache: exit $rc, want 3 (the fake python3's): $(cat "$tmp/out")"
[[ $(ls -A "$foreign") == .cubist-wheel-toolchain ]] ||
  fail "--cache left $(ls -A "$foreign" | tr '\n' ' ')instead of only the marker"

# Marked (a build that stopped half way): rebuilt without --cache too.
echo half >"$foreign/half"
rc=0; PATH=$tmp/fakebin:$PATH "$script" "$foreign" >"$tmp/out" 2>&1 || rc=$?
((rc == 3)) || fail "marked DIR: exit $rc, want 3: $(cat "$tmp/out")"
[[ $(ls -A "$foreign") == .cubist-wheel-toolchain ]] || fail "marked DIR was not emptied"

# A second caller waits for the build that holds DIR's lock, touching nothing meanwhile.
echo half >"$foreign/half"
flock "$foreign" sleep 5 >/dev/null 2>&1 &
holder=$!
sleep 0.5
rc=0; PATH=$tmp/fakebin:$PATH timeout 2 "$script" "$foreign" >"$tmp/out" 2>&1 || rc=$?
((rc == 124)) || fail "locked DIR: exit $rc, want 124 (still waiting): $(cat "$tmp/out")"
[[ -f $foreign/half ]] || fail "locked DIR was changed while another build held it"
kill "$holder" 2>/dev/null || true
wait "$holder" 2>/dev/null || true
echo "wheel-toolchain directory rules: ok"
