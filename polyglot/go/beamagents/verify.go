// Package beamagents verifies the HMAC-SHA256 signatures beam_agents puts on ToolIntents,
// ToolResults and AgentEnvelope.Approvals (beam_agents/intents/signing.py states the design).
//
// A signature covers the message's deterministic serialization with its three signature fields
// (signature_scheme, signing_key_id, signature: the message's highest-numbered fields, found
// here by name) cleared. Verify takes that input from the bytes as received, dropping every
// occurrence of the three fields and keeping every other byte in place, so fields this reader's
// schema does not know are covered exactly as the signer wrote them.
//
// Two schemes. HMAC_SHA256_TYPED (the one signers use) prefixes that input with
// "\x00beam_agents signature HMAC_SHA256_TYPED\x00" + the message's full type name + "\x00",
// so a signature made for one message type never verifies as another's (an effector-signed
// inquiry, a ToolIntent, presented as a ToolResult). HMAC_SHA256, the legacy scheme, covers the
// input alone; it verifies only before the ring's LegacyUntil (DefaultLegacyUntil unless set),
// by the verifier's clock, and is LegacyExpired after.
package beamagents

import (
	"crypto/hmac"
	"crypto/sha256"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

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
	LegacyExpired Verification = "legacy scheme past its window"
)

// signatureBytes is the length of an HMAC-SHA256 signature.
const signatureBytes = 32

// typedDomain starts with a zero byte, which no protobuf serialization does (field number 0 is
// invalid), so no typed input is a legacy input.
const typedDomain = "\x00beam_agents signature HMAC_SHA256_TYPED\x00"

// DefaultLegacyUntil is signing.py's LEGACY_UNTIL: the default end of the legacy window.
var DefaultLegacyUntil = time.Date(2027, 3, 1, 0, 0, 0, 0, time.UTC)

// Ring holds the keys a verifier accepts (key id to secret) and the end of the legacy
// scheme's window (the zero time means DefaultLegacyUntil).
type Ring struct {
	Keys        map[string][]byte
	LegacyUntil time.Time
}

func (r Ring) legacyUntil() time.Time {
	if r.LegacyUntil.IsZero() {
		return DefaultLegacyUntil
	}
	return r.LegacyUntil
}

type signatureFields struct {
	scheme, keyID, signature protoreflect.FieldDescriptor
}

func fieldsOf(md protoreflect.MessageDescriptor) signatureFields {
	fields := md.Fields()
	return signatureFields{
		fields.ByName("signature_scheme"),
		fields.ByName("signing_key_id"),
		fields.ByName("signature"),
	}
}

// StripSignature returns a serialized message of descriptor md without its signature fields.
func StripSignature(wire []byte, md protoreflect.MessageDescriptor) ([]byte, error) {
	f := fieldsOf(md)
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
		switch number {
		case f.scheme.Number(), f.keyID.Number(), f.signature.Number():
		default:
			out = append(out, rest[:tagLength+valueLength]...)
		}
		rest = rest[tagLength+valueLength:]
	}
	return out, nil
}

// domain is what the scheme's HMAC covers before the signing input of a message of md.
func domain(md protoreflect.MessageDescriptor, scheme pb.ToolIntent_SignatureScheme) []byte {
	if scheme == pb.ToolIntent_HMAC_SHA256 {
		return nil
	}
	return []byte(typedDomain + string(md.FullName()) + "\x00")
}

// Verify checks the signature of wire, read as a message of kind's type (for instance
// &pb.ToolResult{}; kind itself is not changed), against ring at instant now, comparing in
// constant time.
func Verify(wire []byte, kind proto.Message, ring Ring, now time.Time) (Verification, error) {
	message := kind.ProtoReflect().Type().New()
	if err := proto.Unmarshal(wire, message.Interface()); err != nil {
		return "", err
	}
	md := message.Descriptor()
	f := fieldsOf(md)
	scheme := pb.ToolIntent_SignatureScheme(message.Get(f.scheme).Enum())
	signature := message.Get(f.signature).Bytes()
	switch scheme {
	case pb.ToolIntent_SIGNATURE_SCHEME_UNSPECIFIED:
		if len(signature) > 0 {
			return BadSignature, nil
		}
		return Unsigned, nil
	case pb.ToolIntent_HMAC_SHA256:
		if !now.Before(ring.legacyUntil()) {
			return LegacyExpired, nil
		}
	case pb.ToolIntent_HMAC_SHA256_TYPED:
	default:
		return UnknownScheme, nil
	}
	secret, known := ring.Keys[message.Get(f.keyID).String()]
	if !known {
		return UnknownKey, nil
	}
	if len(signature) != signatureBytes {
		return BadSignature, nil
	}
	signed, err := StripSignature(wire, md)
	if err != nil {
		return BadSignature, nil
	}
	mac := hmac.New(sha256.New, secret)
	mac.Write(domain(md, scheme))
	mac.Write(signed)
	if hmac.Equal(mac.Sum(nil), signature) {
		return Valid, nil
	}
	return BadSignature, nil
}
