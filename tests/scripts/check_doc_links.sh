#!/usr/bin/env bash
# Every document the repository cites exists in the repository.
#
# Scans the header, sources, scripts, bindings and Markdown files (tracked or
# untracked but not ignored; without git, every file outside build*/ and .git)
# for two kinds of citation:
#   - a Markdown file name or path (`docs/semantics.md S5`, `[abi.md](abi.md)`,
#     `../docs/abi.md`);
#   - any path under docs/ (`docs/perf/`, `docs/Doxyfile.in`).
# A citation resolves when it names an existing file or folder relative to the
# repository root or to the citing file's folder (a name with `*` is a pattern
# that must match at least one). Code that merely looks like a name (`o.md =
# x`, `o.md.c_str()`: followed by `=`, `(`, `[`, `;`, `->` or `.name`) is not
# a citation. Names that follow `$VAR/`,
# `/` or `:` (generated paths, URLs) are not citations. The report files the
# benchmark tools write (decode_bench.md, ...) are listed below as generated.
#
# usage: check_doc_links.sh [ROOT]      (default: the repository of this script)
#        check_doc_links.sh --selftest  (shows that the check can fail)
set -euo pipefail

# Report files written by tools at run time, never stored in the repository.
generated='decode_bench.md append_bench.md floor_bench.md trace_probe.md'

selftest() {
  local work self out
  self=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
  work=$(mktemp -d)
  trap 'rm -rf "$work"' RETURN
  mkdir -p "$work/docs/perf" "$work/src"
  local page=contract missing=nowhere
  printf '# Contract\nSee [the ABI](abi.md) and [notes](perf/notes.md).\n' > "$work/docs/$page.md"
  printf '# ABI\n' > "$work/docs/abi.md"
  printf 'notes\n' > "$work/docs/perf/notes.md"
  printf '// Cites docs/%s.md S5 and docs/perf/, writes $OUT/x.md, see https://e.org/y.md\n' \
    "$page" > "$work/src/a.cpp"
  printf '// Writes decode_bench.md (generated); results in docs/perf/no*.md.\n' > "$work/src/b.cpp"
  printf 'o.md = argv[1]; f(o.md.c_str()); p->x.md[0] = 1;\n' >> "$work/src/b.cpp"
  if ! out=$(bash "$self" "$work" 2>&1); then
    echo "selftest: a tree whose citations all resolve was rejected:"; echo "$out"; return 1
  fi
  # A source comment citing a missing page.
  printf '/* See docs/%s.md S2. */\n' "$missing" > "$work/src/c.c"
  if out=$(bash "$self" "$work" 2>&1); then
    echo "selftest: a missing docs/$missing.md was accepted"; return 1
  fi
  if ! grep -q "src/c.c:1: docs/$missing.md" <<<"$out"; then
    echo "selftest: the report does not name src/c.c and docs/$missing.md:"; echo "$out"; return 1
  fi
  rm "$work/src/c.c"
  # A relative Markdown link in docs/ to a missing page.
  printf 'Also [this](%s.md).\n' "$missing" >> "$work/docs/abi.md"
  if out=$(bash "$self" "$work" 2>&1); then
    echo "selftest: a link from docs/abi.md to a missing $missing.md was accepted"; return 1
  fi
  grep -q "docs/abi.md:2: $missing.md" <<<"$out" ||
    { echo "selftest: wrong report:"; echo "$out"; return 1; }
  # A pattern that matches nothing.
  printf '# ABI\nResults in docs/perf/%s-*.md.\n' "$missing" > "$work/docs/abi.md"
  if bash "$self" "$work" >/dev/null 2>&1; then
    echo "selftest: a pattern matching no file was accepted"; return 1
  fi
  # A missing folder under docs/.
  printf '# ABI\nResults in docs/%s/.\n' "$missing" > "$work/docs/abi.md"
  if bash "$self" "$work" >/dev/null 2>&1; then
    echo "selftest: a missing folder docs/$missing/ was accepted"; return 1
  fi
  echo "selftest: check_doc_links.sh accepts a good tree and rejects missing pages, links and folders"
}

if [[ ${1:-} == --selftest ]]; then
  selftest
  exit
fi

root=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$root"

if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  list=$(git ls-files --cached --others --exclude-standard)
else
  list=$(find . -path ./.git -prune -o -path './build*' -prune -o -type f -print | sed 's|^\./||')
fi
files=()
while IFS= read -r f; do
  [[ -f $f ]] || continue
  case $f in
    build*/* | tests/scripts/check_doc_links.sh) continue ;;
    *.h | *.hpp | *.c | *.cpp | *.cu | *.cuh | *.py | *.pyi | *.rs | *.go | *.sh | *.md | *.cmake | \
      *.txt | *.in | *.toml | *.cfg | .ci/*) files+=("$f") ;;
  esac
done <<<"$list"
[[ ${#files[@]} -gt 0 ]] || { echo "check_doc_links: no files to scan under $root"; exit 1; }

# file:line:citation, for both kinds.
md='(?<![\w./$@{}:*-])(?:[\w.*-]+/)*[\w*-]+\.md\b(?!\s*[=(\[;]|\.\w|->)'
docs='(?<![\w./$@{}:*-])docs/[\w./*-]*[\w/*]'
bad=0
checked=0
while IFS= read -r hit; do
  file=${hit%%:*}
  rest=${hit#*:}
  line=${rest%%:*}
  cite=${rest#*:}
  checked=$((checked + 1))
  if [[ $cite == *'*'* ]]; then  # a pattern: at least one file matches
    if compgen -G "$cite" >/dev/null || compgen -G "$(dirname "$file")/$cite" >/dev/null; then
      continue
    fi
  elif [[ -e $cite || -e $(dirname "$file")/$cite ]]; then
    continue
  fi
  if [[ " $generated " == *" $(basename "$cite") "* ]]; then continue; fi
  echo "$file:$line: $cite does not exist"
  bad=$((bad + 1))
done < <(grep -HnoP "$md|$docs" "${files[@]}" || true)

if [[ $bad -gt 0 ]]; then
  echo "check_doc_links: $bad of $checked citations name a missing file (see docs/semantics.md, docs/abi.md, docs/benchmarks.md for the project's pages)"
  exit 1
fi
echo "check_doc_links: $checked citations in ${#files[@]} files, all present"
