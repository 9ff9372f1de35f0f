package beamagents

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/gowebpki/jcs"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	pb "beam_agents/polyglot/go/beamagentspb"
)

var typeHeader = regexp.MustCompile(`(?m)^# proto-message: (\S+)$`)

var versionDir = regexp.MustCompile(`^v([1-9][0-9]*)$`)

type fixture struct {
	name    string
	decoded proto.Message
	text    string
}

// goldenDir is the newest corpus folder: $BEAM_AGENTS_GOLDEN, else the repository's golden/v<N>
// with the highest N (older ones are frozen, and the newest holds every fixture name they do).
func goldenDir(t *testing.T) string {
	if dir := os.Getenv("BEAM_AGENTS_GOLDEN"); dir != "" {
		return dir
	}
	root := filepath.Join("..", "..", "..", "golden")
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	newest, dir := 0, ""
	for _, entry := range entries {
		match := versionDir.FindStringSubmatch(entry.Name())
		if match == nil || !entry.IsDir() {
			continue
		}
		if version, _ := strconv.Atoi(match[1]); version > newest {
			newest, dir = version, filepath.Join(root, entry.Name())
		}
	}
	if dir == "" {
		t.Fatalf("no golden/v<N> folder under %s", root)
	}
	return dir
}

func fixtures(t *testing.T) []fixture {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(goldenDir(t), "*.binpb"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no golden fixtures under %s (%v)", goldenDir(t), err)
	}
	var found []fixture
	for _, path := range paths {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		text, err := os.ReadFile(strings.TrimSuffix(path, ".binpb") + ".textproto")
		if err != nil {
			t.Fatal(err)
		}
		header := typeHeader.FindSubmatch(text)
		if header == nil {
			t.Fatalf("%s names no proto-message", path)
		}
		messageType, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(header[1]))
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		decoded := messageType.New().Interface()
		if err := proto.Unmarshal(data, decoded); err != nil {
			t.Fatalf("%s does not decode: %v", path, err)
		}
		found = append(found, fixture{filepath.Base(path), decoded, string(text)})
	}
	return found
}

// withoutUnknown is a copy of m with unknown fields dropped at every depth: the text format
// holds known fields only.
func withoutUnknown(m proto.Message) proto.Message {
	copied := proto.Clone(m)
	var discard func(protoreflect.Message)
	discard = func(message protoreflect.Message) {
		message.SetUnknown(nil)
		message.Range(func(field protoreflect.FieldDescriptor, value protoreflect.Value) bool {
			if field.Message() == nil || field.IsMap() {
				return true
			}
			if field.IsList() {
				for i := 0; i < value.List().Len(); i++ {
					discard(value.List().Get(i).Message())
				}
			} else {
				discard(value.Message())
			}
			return true
		})
	}
	discard(copied.ProtoReflect())
	return copied
}

func TestEveryGoldenBlobEqualsItsTextprotoFieldByField(t *testing.T) {
	for _, f := range fixtures(t) {
		expected := f.decoded.ProtoReflect().New().Interface()
		if err := prototext.Unmarshal([]byte(f.text), expected); err != nil {
			t.Fatalf("%s: the textproto does not parse: %v", f.name, err)
		}
		if !proto.Equal(withoutUnknown(f.decoded), expected) {
			t.Errorf("%s differs from its textproto:\n%v\n%v", f.name, f.decoded, expected)
		}
	}
}

func TestTheFutureFieldIntentKeepsItsUnknownFieldThroughAReEncode(t *testing.T) {
	for _, f := range fixtures(t) {
		if f.name != "tool_intent_future_field.binpb" {
			continue
		}
		unknown := f.decoded.ProtoReflect().GetUnknown()
		if !bytes.Contains(unknown, []byte("route=eu")) {
			t.Fatalf("the unknown field 20 is missing: %x", unknown)
		}
		again, err := proto.MarshalOptions{Deterministic: true}.Marshal(f.decoded)
		if err != nil {
			t.Fatal(err)
		}
		reread := &pb.ToolIntent{}
		if err := proto.Unmarshal(again, reread); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(reread.ProtoReflect().GetUnknown(), unknown) || !proto.Equal(reread, f.decoded) {
			t.Errorf("the re-encode lost the unknown field")
		}
		return
	}
	t.Fatal("no tool_intent_future_field fixture")
}

// goldenIntents are the ToolIntents of the corpus, pending ones of snapshots included.
func goldenIntents(t *testing.T) map[string]*pb.ToolIntent {
	intents := map[string]*pb.ToolIntent{}
	for _, f := range fixtures(t) {
		switch m := f.decoded.(type) {
		case *pb.ToolIntent:
			intents[f.name] = m
		case *pb.StateSnapshot:
			for i, pending := range m.GetPending() {
				intents[f.name+"/pending/"+string(rune('0'+i))] = pending
			}
		}
	}
	return intents
}

func TestEveryGoldenArgsJsonIsRfc8785Canonical(t *testing.T) {
	intents := goldenIntents(t)
	if len(intents) < 5 {
		t.Fatalf("only %d golden intents", len(intents))
	}
	for name, intent := range intents {
		canonical, err := jcs.Transform([]byte(intent.GetArgsJson()))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if string(canonical) != intent.GetArgsJson() {
			t.Errorf("%s: %s canonicalizes to %s", name, intent.GetArgsJson(), canonical)
		}
	}
}
