// Go readers of the beam_agents wire formats: the golden corpus and ToolIntent signatures.
// Bindings are generated from protos/beam_agents.proto by tools/polyglot.sh (not committed).
module beam_agents/polyglot/go

// A full version: rules_go's go_sdk.from_file passes the directive through as the SDK version
// (rules_go v0.62.0 go/private/go_mod.bzl:58-60,77-80), and go/private/sdk.bzl:97-98 fails
// unless it is a key of go.dev/dl/?mode=json, which lists 1.24.0, never 1.24.
go 1.24.0

require (
	github.com/gowebpki/jcs v1.0.1
	google.golang.org/protobuf v1.36.12
)

tool google.golang.org/protobuf/cmd/protoc-gen-go
