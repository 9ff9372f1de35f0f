package beam_agents.polyglot;

import beam_agents.v1.BeamAgents.ToolIntent;
import com.google.protobuf.ByteString;
import com.google.protobuf.CodedInputStream;
import com.google.protobuf.Descriptors.Descriptor;
import com.google.protobuf.Descriptors.EnumValueDescriptor;
import com.google.protobuf.Descriptors.FieldDescriptor;
import com.google.protobuf.InvalidProtocolBufferException;
import com.google.protobuf.Message;
import com.google.protobuf.WireFormat;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.security.InvalidKeyException;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.time.Instant;
import java.util.Map;
import java.util.Set;
import javax.crypto.Mac;
import javax.crypto.spec.SecretKeySpec;

/**
 * Verifies the HMAC-SHA256 signatures beam_agents puts on ToolIntents, ToolResults and
 * AgentEnvelope.Approvals (beam_agents/intents/signing.py states the design).
 *
 * <p>A signature covers the message's deterministic serialization with its three signature
 * fields (signature_scheme, signing_key_id, signature: the message's highest-numbered fields,
 * found here by name) cleared. {@link #verify} takes that input from the bytes as received,
 * dropping every occurrence of the three fields and keeping every other byte in place, so fields
 * this reader's schema does not know are covered exactly as the signer wrote them.
 *
 * <p>Two schemes. HMAC_SHA256_TYPED (the one signers use) prefixes that input with {@code
 * "\0beam_agents signature HMAC_SHA256_TYPED\0"}, the message's full type name and {@code "\0"},
 * so a signature made for one message type never verifies as another's (an effector-signed
 * inquiry, a ToolIntent, presented as a ToolResult). HMAC_SHA256, the legacy scheme, covers the
 * input alone; it verifies only before the ring's legacy window ends, by the verifier's clock,
 * and is LEGACY_EXPIRED after.
 */
public final class Signatures {
  /** The outcome of {@link #verify}, named as beam_agents' Python Verification. */
  public enum Verification {
    VALID,
    UNSIGNED,
    UNKNOWN_KEY,
    BAD_SIGNATURE,
    UNKNOWN_SCHEME,
    LEGACY_EXPIRED
  }

  /**
   * The keys a verifier accepts (key id to secret) and the instant the legacy scheme's window
   * ends.
   */
  // A class, not a record: the library is read by users compiling at Java 11 (rules_java's
  // default level), where records do not exist.
  public static final class Ring {
    /** signing.py's LEGACY_UNTIL: the default end of the legacy window. */
    public static final Instant DEFAULT_LEGACY_UNTIL = Instant.parse("2027-03-01T00:00:00Z");

    private final Map<String, byte[]> keys;
    private final Instant legacyUntil;

    public Ring(Map<String, byte[]> keys, Instant legacyUntil) {
      this.keys = keys;
      this.legacyUntil = legacyUntil;
    }

    public static Ring of(Map<String, byte[]> keys) {
      return new Ring(keys, DEFAULT_LEGACY_UNTIL);
    }

    public Map<String, byte[]> keys() {
      return keys;
    }

    public Instant legacyUntil() {
      return legacyUntil;
    }
  }

  private static final int SIGNATURE_BYTES = 32;

  // Starts with a zero byte, which no protobuf serialization does (field number 0 is invalid),
  // so no typed input is a legacy input.
  private static final String TYPED_DOMAIN = "\0beam_agents signature HMAC_SHA256_TYPED\0";

  private Signatures() {}

  private static FieldDescriptor field(Descriptor type, String name) {
    return type.findFieldByName(name);
  }

  private static Set<Integer> signatureNumbers(Descriptor type) {
    return Set.of(
        field(type, "signature_scheme").getNumber(),
        field(type, "signing_key_id").getNumber(),
        field(type, "signature").getNumber());
  }

  /** A serialized message of {@code type} without its signature fields. */
  public static byte[] stripSignature(byte[] wire, Descriptor type)
      throws InvalidProtocolBufferException {
    Set<Integer> signatureFields = signatureNumbers(type);
    CodedInputStream input = CodedInputStream.newInstance(wire);
    ByteArrayOutputStream kept = new ByteArrayOutputStream(wire.length);
    try {
      while (!input.isAtEnd()) {
        int start = input.getTotalBytesRead();
        int tag = input.readTag();
        if (!input.skipField(tag)) {
          throw new InvalidProtocolBufferException("an end-group tag outside any group");
        }
        int end = input.getTotalBytesRead();
        if (!signatureFields.contains(WireFormat.getTagFieldNumber(tag))) {
          kept.write(wire, start, end - start);
        }
      }
    } catch (InvalidProtocolBufferException e) {
      throw e;
    } catch (IOException e) { // a byte array has no other I/O to fail
      throw new InvalidProtocolBufferException(e);
    }
    return kept.toByteArray();
  }

  /** What the scheme's HMAC covers before the signing input of a message of {@code type}. */
  private static byte[] domain(Descriptor type, int scheme) {
    if (scheme == ToolIntent.SignatureScheme.HMAC_SHA256_VALUE) {
      return new byte[0];
    }
    return (TYPED_DOMAIN + type.getFullName() + "\0").getBytes(StandardCharsets.UTF_8);
  }

  /** HMAC-SHA256 of {@code domain} then {@code data} under {@code secret}. */
  static byte[] mac(byte[] secret, byte[] domain, byte[] data) {
    try {
      Mac mac = Mac.getInstance("HmacSHA256");
      mac.init(new SecretKeySpec(secret, "HmacSHA256"));
      mac.update(domain);
      return mac.doFinal(data);
    } catch (NoSuchAlgorithmException | InvalidKeyException e) {
      throw new IllegalStateException("HMAC-SHA256 is part of every Java runtime", e);
    }
  }

  /**
   * Checks the signature of {@code wire}, read as a message of {@code prototype}'s type (for
   * instance {@code ToolResult.getDefaultInstance()}), against {@code ring} at {@code now}.
   */
  public static Verification verify(byte[] wire, Message prototype, Ring ring, Instant now)
      throws InvalidProtocolBufferException {
    Message message = prototype.getParserForType().parseFrom(wire);
    Descriptor type = prototype.getDescriptorForType();
    int scheme =
        ((EnumValueDescriptor) message.getField(field(type, "signature_scheme"))).getNumber();
    byte[] signature =
        ((ByteString) message.getField(field(type, "signature")))
            .toByteArray();
    switch (scheme) {
      case ToolIntent.SignatureScheme.SIGNATURE_SCHEME_UNSPECIFIED_VALUE:
        return signature.length == 0 ? Verification.UNSIGNED : Verification.BAD_SIGNATURE;
      case ToolIntent.SignatureScheme.HMAC_SHA256_VALUE:
        if (!now.isBefore(ring.legacyUntil())) {
          return Verification.LEGACY_EXPIRED;
        }
        break;
      case ToolIntent.SignatureScheme.HMAC_SHA256_TYPED_VALUE:
        break;
      default:
        return Verification.UNKNOWN_SCHEME;
    }
    byte[] secret = ring.keys().get((String) message.getField(field(type, "signing_key_id")));
    if (secret == null) {
      return Verification.UNKNOWN_KEY;
    }
    if (signature.length != SIGNATURE_BYTES) {
      return Verification.BAD_SIGNATURE;
    }
    byte[] expected = mac(secret, domain(type, scheme), stripSignature(wire, type));
    return MessageDigest.isEqual(expected, signature)
        ? Verification.VALID
        : Verification.BAD_SIGNATURE;
  }
}
