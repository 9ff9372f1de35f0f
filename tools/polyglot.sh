#!/usr/bin/env bash
# Go and Java readers of beam_agents' wire formats, without Bazel: generate their bindings from
# protos/beam_agents.proto with protoc 31.1, then run their tests. Go's come from the
# grpcio-tools protoc of requirements_lock.txt with protoc-gen-go (pinned by polyglot/go/go.mod
# and go.sum); Java's from the protoc 31.1 that Maven Central publishes
# (com.google.protobuf:protoc:4.31.1:exe:<platform>), since grpcio-tools bundles only the Python
# generators; polyglot/java/pom.xml pins the rest. Generated code is not committed.
#
#   bash tools/polyglot.sh go|java|all
#
# Needs the .venv of tools/dev.sh (for protoc), Go 1.24+ and Java 17 with Maven.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
protoc=(.venv/bin/python -m grpc_tools.protoc -Iprotos)

go_tests() {
  local bin="$root/polyglot/go/.bin"
  mkdir -p "$bin" polyglot/go/beamagentspb
  (cd polyglot/go && go build -o "$bin/protoc-gen-go" google.golang.org/protobuf/cmd/protoc-gen-go)
  "${protoc[@]}" --plugin="protoc-gen-go=$bin/protoc-gen-go" \
    --go_out=polyglot/go/beamagentspb --go_opt=paths=source_relative \
    --go_opt=Mbeam_agents.proto=beam_agents/polyglot/go/beamagentspb \
    protos/beam_agents.proto
  (cd polyglot/go && go vet ./... && go test -count=1 -v ./...)
}

protoc_platform() {
  case "$(uname -s)-$(uname -m)" in
    Linux-x86_64) echo linux-x86_64 ;;
    Linux-aarch64) echo linux-aarch_64 ;;
    Darwin-x86_64) echo osx-x86_64 ;;
    Darwin-arm64) echo osx-aarch_64 ;;
    *) echo "tools/polyglot.sh: no protoc build for $(uname -s)-$(uname -m)" >&2; exit 2 ;;
  esac
}

java_tests() {
  local target=polyglot/java/target protoc_java
  local generated="$target/generated-sources/protobuf"
  protoc_java="$root/$target/protoc-31.1"
  mkdir -p "$generated"
  if [[ ! -x "$protoc_java" ]]; then
    mvn -q -B -ntp dependency:copy -Dmdep.useBaseVersion=true \
      "-Dartifact=com.google.protobuf:protoc:4.31.1:exe:$(protoc_platform)" \
      -DoutputDirectory="$root/$target" -Dmdep.stripClassifier=false
    mv "$root/$target/protoc-4.31.1-$(protoc_platform).exe" "$protoc_java"
    chmod +x "$protoc_java"
  fi
  "$protoc_java" -Iprotos --java_out="$generated" protos/beam_agents.proto
  (cd polyglot/java && mvn -B -ntp test)
}

case "${1:-all}" in
  go) go_tests ;;
  java) java_tests ;;
  all) go_tests; java_tests ;;
  *) sed -n '2,10p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
