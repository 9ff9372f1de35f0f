// Go readers of the beam_agents wire formats: the golden corpus and ToolIntent signatures.
// Bindings are generated from protos/beam_agents.proto by tools/polyglot.sh (not committed).
module beam_agents/polyglot/go

go 1.24

require (
	github.com/gowebpki/jcs v1.0.1
	google.golang.org/protobuf v1.36.12
)

tool google.golang.org/protobuf/cmd/protoc-gen-go
