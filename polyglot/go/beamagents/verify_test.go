package beamagents

import (
	"encoding/base64"
	"os"
	"path/filepath"
	"testing"
)

// The published golden test key (golden/v<N>/builders.py): never a production secret.
var goldenKeys = map[string][]byte{
	"golden-2026-11": []byte("beam_agents golden corpus test key, not a secret"),
}

func goldenSigned(t *testing.T) []byte {
	data, err := os.ReadFile(filepath.Join(goldenDir(t), "tool_intent_signed.binpb"))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestTheGoldenSignedIntentVerifiesUnderTheGoldenKey(t *testing.T) {
	outcome, err := Verify(goldenSigned(t), goldenKeys)
	if err != nil || outcome != Valid {
		t.Fatalf("got %q, %v", outcome, err)
	}
	if outcome, _ := Verify(goldenSigned(t), map[string][]byte{"other": []byte("k")}); outcome != UnknownKey {
		t.Errorf("another ring: got %q", outcome)
	}
}

func TestAOneByteChangeAnywhereDoesNotVerify(t *testing.T) {
	signed := goldenSigned(t)
	for position := range signed {
		changed := append([]byte(nil), signed...)
		changed[position] ^= 0x01
		outcome, err := Verify(changed, goldenKeys)
		if err == nil && outcome == Valid {
			t.Errorf("a change at byte %d still verifies", position)
		}
	}
}

func TestUnsignedAndWrongLengthSignaturesAreRefused(t *testing.T) {
	signed := goldenSigned(t)
	stripped, err := StripSignature(signed)
	if err != nil {
		t.Fatal(err)
	}
	if outcome, _ := Verify(stripped, goldenKeys); outcome != Unsigned {
		t.Errorf("without its signature: got %q", outcome)
	}
	// The signature is the last field: cut one byte of it and fix its length prefix.
	short := append([]byte(nil), signed[:len(signed)-1]...)
	short[len(short)-32] = 31
	if outcome, _ := Verify(short, goldenKeys); outcome == Valid {
		t.Errorf("a 31-byte signature verifies")
	}
}

// TestAnIntentSignedInPythonVerifies runs when polyglot_test.py signs an intent with a fresh
// key and passes the files in the environment.
func TestAnIntentSignedInPythonVerifies(t *testing.T) {
	path, key := os.Getenv("BEAM_AGENTS_FRESH_INTENT"), os.Getenv("BEAM_AGENTS_FRESH_KEY")
	if path == "" || key == "" {
		t.Skip("run from polyglot/polyglot_test.py, which signs a fresh intent")
	}
	secret, err := base64.StdEncoding.DecodeString(key)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string][]byte{os.Getenv("BEAM_AGENTS_FRESH_KEY_ID"): secret}
	if outcome, err := Verify(data, keys); err != nil || outcome != Valid {
		t.Fatalf("got %q, %v", outcome, err)
	}
	data[len(data)/2] ^= 0x01
	if outcome, _ := Verify(data, keys); outcome == Valid {
		t.Fatal("a changed fresh intent verifies")
	}
}
