#!/bin/sh
# promtool (Debian package prometheus, scripts/install_deps.sh) validates the
# scrape configuration, the rule files it names, and the rules on their own.
set -eu
command -v promtool >/dev/null || { echo "promtool is not installed (scripts/install_deps.sh)"; exit 1; }
dir="${TEST_SRCDIR:-.}/hsap/deploy/prometheus"
[ -d "$dir" ] || dir="deploy/prometheus"
promtool check config "$dir/prometheus.yml"
promtool check rules "$dir/hsap_rules.yml"
