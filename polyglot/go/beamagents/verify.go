// Package beamagents verifies the HMAC-SHA256 signatures beam_agents puts on ToolIntents.
//
// The signature covers the intent's deterministic serialization with its three signature
// fields (signature_scheme 12, signing_key_id 13, signature 14) cleared. Verify takes that
// input from the bytes as received, dropping every occurrence of the three fields and keeping
// every other byte in place, so fields this reader's schema does not know are covered exactly
// as the signer wrote them.
package beamagents

import (
	"crypto/hmac"
	"crypto/sha256"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	pb "beam_agents/polyglot/go/beamagentspb"
)

// Verification is the outcome of Verify, named as beam_agents' Python Verification.
type Verification string

const (
	Valid         Verification = "valid"
	Unsigned      Verification = "unsigned"
	UnknownKey    Verification = "unknown key"
	BadSignature  Verification = "bad signature"
	UnknownScheme Verification = "unknown scheme"
)

// signatureBytes is the length of an HMAC-SHA256 signature.
const signatureBytes = 32

var signatureFields = map[protowire.Number]bool{12: true, 13: true, 14: true}

// StripSignature returns a serialized ToolIntent without its signature fields.
func StripSignature(wire []byte) ([]byte, error) {
	out := make([]byte, 0, len(wire))
	for rest := wire; len(rest) > 0; {
		number, kind, tagLength := protowire.ConsumeTag(rest)
		if tagLength < 0 {
			return nil, protowire.ParseError(tagLength)
		}
		valueLength := protowire.ConsumeFieldValue(number, kind, rest[tagLength:])
		if valueLength < 0 {
			return nil, protowire.ParseError(valueLength)
		}
		if !signatureFields[number] {
			out = append(out, rest[:tagLength+valueLength]...)
		}
		rest = rest[tagLength+valueLength:]
	}
	return out, nil
}

// Verify checks the signature of the serialized ToolIntent wire against keys (key id to
// secret), comparing in constant time.
func Verify(wire []byte, keys map[string][]byte) (Verification, error) {
	intent := &pb.ToolIntent{}
	if err := proto.Unmarshal(wire, intent); err != nil {
		return "", err
	}
	switch {
	case intent.GetSignatureScheme() == pb.ToolIntent_SIGNATURE_SCHEME_UNSPECIFIED:
		if len(intent.GetSignature()) > 0 {
			return BadSignature, nil
		}
		return Unsigned, nil
	case intent.GetSignatureScheme() != pb.ToolIntent_HMAC_SHA256:
		return UnknownScheme, nil
	}
	secret, known := keys[intent.GetSigningKeyId()]
	if !known {
		return UnknownKey, nil
	}
	if len(intent.GetSignature()) != signatureBytes {
		return BadSignature, nil
	}
	signed, err := StripSignature(wire)
	if err != nil {
		return BadSignature, nil
	}
	mac := hmac.New(sha256.New, secret)
	mac.Write(signed)
	if hmac.Equal(mac.Sum(nil), intent.GetSignature()) {
		return Valid, nil
	}
	return BadSignature, nil
}
