package beam_agents.polyglot;

import beam_agents.v1.BeamAgents.ToolIntent;
import com.google.protobuf.CodedInputStream;
import com.google.protobuf.InvalidProtocolBufferException;
import com.google.protobuf.WireFormat;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.security.InvalidKeyException;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.Map;
import java.util.Set;
import javax.crypto.Mac;
import javax.crypto.spec.SecretKeySpec;

/**
 * Verifies the HMAC-SHA256 signatures beam_agents puts on ToolIntents.
 *
 * <p>The signature covers the intent's deterministic serialization with its three signature
 * fields (signature_scheme 12, signing_key_id 13, signature 14) cleared. {@link #verify} takes
 * that input from the bytes as received, dropping every occurrence of the three fields and
 * keeping every other byte in place, so fields this reader's schema does not know are covered
 * exactly as the signer wrote them.
 */
public final class Signatures {
  /** The outcome of {@link #verify}, named as beam_agents' Python Verification. */
  public enum Verification {
    VALID,
    UNSIGNED,
    UNKNOWN_KEY,
    BAD_SIGNATURE,
    UNKNOWN_SCHEME
  }

  private static final Set<Integer> SIGNATURE_FIELDS = Set.of(12, 13, 14);
  private static final int SIGNATURE_BYTES = 32;

  private Signatures() {}

  /** A serialized ToolIntent without its signature fields. */
  public static byte[] stripSignature(byte[] wire) throws InvalidProtocolBufferException {
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
        if (!SIGNATURE_FIELDS.contains(WireFormat.getTagFieldNumber(tag))) {
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

  /** Checks the signature of a serialized ToolIntent against keys (id to secret). */
  public static Verification verify(byte[] wire, Map<String, byte[]> keys)
      throws InvalidProtocolBufferException {
    ToolIntent intent = ToolIntent.parseFrom(wire);
    if (intent.getSignatureScheme() == ToolIntent.SignatureScheme.SIGNATURE_SCHEME_UNSPECIFIED) {
      return intent.getSignature().isEmpty() ? Verification.UNSIGNED : Verification.BAD_SIGNATURE;
    }
    if (intent.getSignatureScheme() != ToolIntent.SignatureScheme.HMAC_SHA256) {
      return Verification.UNKNOWN_SCHEME;
    }
    byte[] secret = keys.get(intent.getSigningKeyId());
    if (secret == null) {
      return Verification.UNKNOWN_KEY;
    }
    if (intent.getSignature().size() != SIGNATURE_BYTES) {
      return Verification.BAD_SIGNATURE;
    }
    byte[] expected;
    try {
      Mac mac = Mac.getInstance("HmacSHA256");
      mac.init(new SecretKeySpec(secret, "HmacSHA256"));
      expected = mac.doFinal(stripSignature(wire));
    } catch (NoSuchAlgorithmException | InvalidKeyException e) {
      throw new IllegalStateException("HMAC-SHA256 is part of every Java runtime", e);
    }
    return MessageDigest.isEqual(expected, intent.getSignature().toByteArray())
        ? Verification.VALID
        : Verification.BAD_SIGNATURE;
  }
}
