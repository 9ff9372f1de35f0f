package beamagents

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	pb "beam_agents/polyglot/go/beamagentspb"
)

// The published golden test key (golden/v<N>/builders.py): never a production secret.
const goldenKeyID = "golden-2026-11"

var goldenRing = Ring{Keys: map[string][]byte{
	goldenKeyID: []byte("beam_agents golden corpus test key, not a secret"),
}}

// insideTheWindow is an instant before DefaultLegacyUntil: the golden intent is legacy-signed.
var insideTheWindow = time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)

var (
	intentType = (&pb.ToolIntent{}).ProtoReflect().Descriptor()
	resultType = (&pb.ToolResult{}).ProtoReflect().Descriptor()
)

func goldenSigned(t *testing.T) []byte {
	data, err := os.ReadFile(filepath.Join(goldenDir(t), "tool_intent_signed.binpb"))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// envelope encodes the three signature fields of a message of md, as a signer appends them.
func envelope(md protoreflect.MessageDescriptor, scheme pb.ToolIntent_SignatureScheme, keyID string, signature []byte) []byte {
	f := fieldsOf(md)
	out := protowire.AppendTag(nil, f.scheme.Number(), protowire.VarintType)
	out = protowire.AppendVarint(out, uint64(scheme))
	out = protowire.AppendTag(out, f.keyID.Number(), protowire.BytesType)
	out = protowire.AppendString(out, keyID)
	out = protowire.AppendTag(out, f.signature.Number(), protowire.BytesType)
	return protowire.AppendBytes(out, signature)
}

// signTypedIntent signs a serialized unsigned ToolIntent under the golden key, typed: the
// input is stated byte for byte, as signing.py's tests state it.
func signTypedIntent(unsigned []byte) []byte {
	mac := hmac.New(sha256.New, goldenRing.Keys[goldenKeyID])
	mac.Write([]byte("\x00beam_agents signature HMAC_SHA256_TYPED\x00beam_agents.v1.ToolIntent\x00"))
	mac.Write(unsigned)
	signature := mac.Sum(nil)
	signed := append([]byte(nil), unsigned...)
	return append(signed, envelope(intentType, pb.ToolIntent_HMAC_SHA256_TYPED, goldenKeyID, signature)...)
}

func TestTheGoldenSignedIntentVerifiesUnderTheGoldenKey(t *testing.T) {
	outcome, err := Verify(goldenSigned(t), &pb.ToolIntent{}, goldenRing, insideTheWindow)
	if err != nil || outcome != Valid {
		t.Fatalf("got %q, %v", outcome, err)
	}
	other := Ring{Keys: map[string][]byte{"other": []byte("k")}}
	if outcome, _ := Verify(goldenSigned(t), &pb.ToolIntent{}, other, insideTheWindow); outcome != UnknownKey {
		t.Errorf("another ring: got %q", outcome)
	}
}

func TestALegacySignatureVerifiesOnlyInsideItsWindow(t *testing.T) {
	end := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	ring := Ring{Keys: goldenRing.Keys, LegacyUntil: end}
	for now, want := range map[time.Time]Verification{
		end.Add(-time.Millisecond): Valid,
		end:                        LegacyExpired,
		DefaultLegacyUntil:         LegacyExpired,
	} {
		if outcome, _ := Verify(goldenSigned(t), &pb.ToolIntent{}, ring, now); outcome != want {
			t.Errorf("at %v: got %q, want %q", now, outcome, want)
		}
	}
	if outcome, _ := Verify(goldenSigned(t), &pb.ToolIntent{}, goldenRing, DefaultLegacyUntil); outcome != LegacyExpired {
		t.Errorf("at the default window's end: got %q", outcome)
	}
}

func TestATypedSignatureVerifiesOnlyAsItsOwnType(t *testing.T) {
	unsigned, err := StripSignature(goldenSigned(t), intentType)
	if err != nil {
		t.Fatal(err)
	}
	intent := signTypedIntent(unsigned)
	if outcome, _ := Verify(intent, &pb.ToolIntent{}, goldenRing, DefaultLegacyUntil); outcome != Valid {
		t.Fatalf("as a ToolIntent: got %q", outcome)
	}
	// The same fields and signature, enveloped as a ToolResult's.
	parsed := &pb.ToolIntent{}
	if err := proto.Unmarshal(intent, parsed); err != nil {
		t.Fatal(err)
	}
	replay := append(append([]byte(nil), unsigned...),
		envelope(resultType, pb.ToolIntent_HMAC_SHA256_TYPED, goldenKeyID, parsed.GetSignature())...)
	if outcome, _ := Verify(replay, &pb.ToolResult{}, goldenRing, insideTheWindow); outcome != BadSignature {
		t.Errorf("as a ToolResult: got %q", outcome)
	}
	// Relabelled as legacy, the typed signature covers a different input.
	relabelled := append(append([]byte(nil), unsigned...),
		envelope(intentType, pb.ToolIntent_HMAC_SHA256, goldenKeyID, parsed.GetSignature())...)
	if outcome, _ := Verify(relabelled, &pb.ToolIntent{}, goldenRing, insideTheWindow); outcome != BadSignature {
		t.Errorf("relabelled legacy: got %q", outcome)
	}
}

func TestAOneByteChangeAnywhereDoesNotVerify(t *testing.T) {
	signed := goldenSigned(t)
	for position := range signed {
		changed := append([]byte(nil), signed...)
		changed[position] ^= 0x01
		outcome, err := Verify(changed, &pb.ToolIntent{}, goldenRing, insideTheWindow)
		if err == nil && outcome == Valid {
			t.Errorf("a change at byte %d still verifies", position)
		}
	}
}

func TestUnsignedAndWrongLengthSignaturesAreRefused(t *testing.T) {
	signed := goldenSigned(t)
	stripped, err := StripSignature(signed, intentType)
	if err != nil {
		t.Fatal(err)
	}
	if outcome, _ := Verify(stripped, &pb.ToolIntent{}, goldenRing, insideTheWindow); outcome != Unsigned {
		t.Errorf("without its signature: got %q", outcome)
	}
	// The signature is the last field: cut one byte of it and fix its length prefix.
	short := append([]byte(nil), signed[:len(signed)-1]...)
	short[len(short)-32] = 31
	if outcome, _ := Verify(short, &pb.ToolIntent{}, goldenRing, insideTheWindow); outcome == Valid {
		t.Errorf("a 31-byte signature verifies")
	}
}

// fresh reads a file polyglot_test.py signed in Python, named by the environment variable.
func fresh(t *testing.T, variable string) []byte {
	path := os.Getenv(variable)
	if path == "" {
		t.Skip("run from polyglot/polyglot_test.py, which signs fresh messages")
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func freshRing(t *testing.T) Ring {
	secret, err := base64.StdEncoding.DecodeString(os.Getenv("BEAM_AGENTS_FRESH_KEY"))
	if err != nil {
		t.Fatal(err)
	}
	return Ring{Keys: map[string][]byte{os.Getenv("BEAM_AGENTS_FRESH_KEY_ID"): secret}}
}

// TestAnIntentSignedInPythonVerifies runs when polyglot_test.py signs an intent with a fresh
// key and passes the files in the environment.
func TestAnIntentSignedInPythonVerifies(t *testing.T) {
	data := fresh(t, "BEAM_AGENTS_FRESH_INTENT")
	ring := freshRing(t)
	if outcome, err := Verify(data, &pb.ToolIntent{}, ring, time.Now()); err != nil || outcome != Valid {
		t.Fatalf("got %q, %v", outcome, err)
	}
	data[len(data)/2] ^= 0x01
	if outcome, _ := Verify(data, &pb.ToolIntent{}, ring, time.Now()); outcome == Valid {
		t.Fatal("a changed fresh intent verifies")
	}
}

// TestPythonSignaturesVerifyByTypeAndScheme: a typed ToolResult verifies; an inquiry's typed
// signature verifies as the ToolIntent it was made for and not re-enveloped as a ToolResult; a
// legacy ToolResult verifies inside its window and is LegacyExpired after.
func TestPythonSignaturesVerifyByTypeAndScheme(t *testing.T) {
	ring := freshRing(t)
	end := DefaultLegacyUntil
	cases := []struct {
		variable string
		kind     proto.Message
		now      time.Time
		want     Verification
	}{
		{"BEAM_AGENTS_FRESH_RESULT", &pb.ToolResult{}, end, Valid},
		{"BEAM_AGENTS_FRESH_INQUIRY", &pb.ToolIntent{}, end, Valid},
		{"BEAM_AGENTS_FRESH_INQUIRY_AS_RESULT", &pb.ToolResult{}, insideTheWindow, BadSignature},
		{"BEAM_AGENTS_FRESH_LEGACY_RESULT", &pb.ToolResult{}, end.Add(-time.Millisecond), Valid},
		{"BEAM_AGENTS_FRESH_LEGACY_RESULT", &pb.ToolResult{}, end, LegacyExpired},
	}
	for _, c := range cases {
		outcome, err := Verify(fresh(t, c.variable), c.kind, ring, c.now)
		if err != nil || outcome != c.want {
			t.Errorf("%s at %v: got %q, %v; want %q", c.variable, c.now, outcome, err, c.want)
		}
	}
}
