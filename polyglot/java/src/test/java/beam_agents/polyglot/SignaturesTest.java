package beam_agents.polyglot;

import static beam_agents.polyglot.Signatures.verify;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import beam_agents.polyglot.Signatures.Ring;
import beam_agents.polyglot.Signatures.Verification;
import beam_agents.v1.BeamAgents.ToolIntent;
import beam_agents.v1.BeamAgents.ToolResult;
import com.google.protobuf.ByteString;
import com.google.protobuf.Descriptors.Descriptor;
import com.google.protobuf.InvalidProtocolBufferException;
import com.google.protobuf.Message;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.time.Instant;
import java.util.Base64;
import java.util.Map;
import org.junit.jupiter.api.Test;

class SignaturesTest {
  /** The published golden test key (golden/v<N>/builders.py): never a production secret. */
  private static final String GOLDEN_KEY_ID = "golden-2026-11";

  private static final Ring GOLDEN_RING =
      Ring.of(
          Map.of(
              GOLDEN_KEY_ID,
              "beam_agents golden corpus test key, not a secret".getBytes(StandardCharsets.UTF_8)));

  /** An instant before the default window's end: the golden intent is legacy-signed. */
  private static final Instant INSIDE_THE_WINDOW = Instant.parse("2026-12-01T00:00:00Z");

  private static final Message INTENT = ToolIntent.getDefaultInstance();
  private static final Message RESULT = ToolResult.getDefaultInstance();

  private static byte[] goldenSigned() throws Exception {
    return Files.readAllBytes(Golden.dir().resolve("tool_intent_signed.binpb"));
  }

  @Test
  void theGoldenSignedIntentVerifiesUnderTheGoldenKey() throws Exception {
    assertEquals(
        Verification.VALID, verify(goldenSigned(), INTENT, GOLDEN_RING, INSIDE_THE_WINDOW));
    assertEquals(
        Verification.UNKNOWN_KEY,
        verify(goldenSigned(), INTENT, Ring.of(Map.of("other", new byte[32])), INSIDE_THE_WINDOW));
  }

  @Test
  void aLegacySignatureVerifiesOnlyInsideItsWindow() throws Exception {
    Instant end = Instant.parse("2026-12-02T00:00:00Z");
    Ring ring = new Ring(GOLDEN_RING.keys(), end);
    assertEquals(
        Verification.VALID, verify(goldenSigned(), INTENT, ring, end.minus(Duration.ofMillis(1))));
    assertEquals(Verification.LEGACY_EXPIRED, verify(goldenSigned(), INTENT, ring, end));
    assertEquals(
        Verification.LEGACY_EXPIRED,
        verify(goldenSigned(), INTENT, GOLDEN_RING, Ring.DEFAULT_LEGACY_UNTIL));
  }

  /** {@code unsigned} as a message of {@code type}, with a signature envelope. */
  private static byte[] enveloped(byte[] unsigned, Message type, int scheme, byte[] signature)
      throws InvalidProtocolBufferException {
    Descriptor descriptor = type.getDescriptorForType();
    return type.newBuilderForType()
        .mergeFrom(unsigned)
        .setField(
            descriptor.findFieldByName("signature_scheme"),
            ToolIntent.SignatureScheme.getDescriptor().findValueByNumber(scheme))
        .setField(descriptor.findFieldByName("signing_key_id"), GOLDEN_KEY_ID)
        .setField(descriptor.findFieldByName("signature"), ByteString.copyFrom(signature))
        .build()
        .toByteArray();
  }

  @Test
  void aTypedSignatureVerifiesOnlyAsItsOwnType() throws Exception {
    byte[] unsigned = Signatures.stripSignature(goldenSigned(), INTENT.getDescriptorForType());
    int typed = ToolIntent.SignatureScheme.HMAC_SHA256_TYPED_VALUE;
    // The input stated byte for byte, as signing.py's tests state it.
    byte[] domain =
        "\0beam_agents signature HMAC_SHA256_TYPED\0beam_agents.v1.ToolIntent\0"
            .getBytes(StandardCharsets.UTF_8);
    byte[] signature = Signatures.mac(GOLDEN_RING.keys().get(GOLDEN_KEY_ID), domain, unsigned);
    byte[] intent = enveloped(unsigned, INTENT, typed, signature);
    assertEquals(
        Verification.VALID, verify(intent, INTENT, GOLDEN_RING, Ring.DEFAULT_LEGACY_UNTIL));
    // The same fields and signature, enveloped as a ToolResult's.
    byte[] replay = enveloped(unsigned, RESULT, typed, signature);
    assertEquals(
        Verification.BAD_SIGNATURE, verify(replay, RESULT, GOLDEN_RING, INSIDE_THE_WINDOW));
    // Relabelled as legacy, the typed signature covers a different input.
    byte[] relabelled =
        enveloped(unsigned, INTENT, ToolIntent.SignatureScheme.HMAC_SHA256_VALUE, signature);
    assertEquals(
        Verification.BAD_SIGNATURE, verify(relabelled, INTENT, GOLDEN_RING, INSIDE_THE_WINDOW));
  }

  @Test
  void aOneByteChangeAnywhereDoesNotVerify() throws Exception {
    byte[] signed = goldenSigned();
    for (int position = 0; position < signed.length; position++) {
      byte[] changed = signed.clone();
      changed[position] ^= 0x01;
      Verification outcome;
      try {
        outcome = verify(changed, INTENT, GOLDEN_RING, INSIDE_THE_WINDOW);
      } catch (InvalidProtocolBufferException e) {
        continue; // no longer an intent at all
      }
      assertNotEquals(Verification.VALID, outcome, "a change at byte " + position);
    }
  }

  @Test
  void unsignedAndWrongLengthSignaturesAreRefused() throws Exception {
    byte[] signed = goldenSigned();
    byte[] stripped = Signatures.stripSignature(signed, INTENT.getDescriptorForType());
    assertEquals(Verification.UNSIGNED, verify(stripped, INTENT, GOLDEN_RING, INSIDE_THE_WINDOW));
    // The signature is the last field: cut one byte of it and fix its length prefix.
    byte[] shorter = java.util.Arrays.copyOf(signed, signed.length - 1);
    shorter[shorter.length - 32] = 31;
    assertEquals(
        Verification.BAD_SIGNATURE, verify(shorter, INTENT, GOLDEN_RING, INSIDE_THE_WINDOW));
  }

  /** A file polyglot_test.py signed in Python, named by the environment variable. */
  private static byte[] fresh(String variable) throws Exception {
    String path = System.getenv(variable);
    assumeTrue(path != null, "run from polyglot/polyglot_test.py");
    return Files.readAllBytes(Path.of(path));
  }

  private static Ring freshRing() {
    return Ring.of(
        Map.of(
            System.getenv("BEAM_AGENTS_FRESH_KEY_ID"),
            Base64.getDecoder().decode(System.getenv("BEAM_AGENTS_FRESH_KEY"))));
  }

  /** Runs when polyglot_test.py signs an intent with a fresh key and passes the files. */
  @Test
  void anIntentSignedInPythonVerifies() throws Exception {
    byte[] data = fresh("BEAM_AGENTS_FRESH_INTENT");
    assertEquals(Verification.VALID, verify(data, INTENT, freshRing(), Instant.now()));
    data[data.length / 2] ^= 0x01;
    assertNotEquals(Verification.VALID, verify(data, INTENT, freshRing(), Instant.now()));
  }

  /**
   * A typed ToolResult verifies; an inquiry's typed signature verifies as the ToolIntent it was
   * made for and not re-enveloped as a ToolResult; a legacy ToolResult verifies inside its
   * window and is LEGACY_EXPIRED after.
   */
  @Test
  void pythonSignaturesVerifyByTypeAndScheme() throws Exception {
    Ring ring = freshRing();
    Instant end = Ring.DEFAULT_LEGACY_UNTIL;
    assertEquals(
        Verification.VALID, verify(fresh("BEAM_AGENTS_FRESH_RESULT"), RESULT, ring, end));
    assertEquals(
        Verification.VALID, verify(fresh("BEAM_AGENTS_FRESH_INQUIRY"), INTENT, ring, end));
    assertEquals(
        Verification.BAD_SIGNATURE,
        verify(fresh("BEAM_AGENTS_FRESH_INQUIRY_AS_RESULT"), RESULT, ring, INSIDE_THE_WINDOW));
    byte[] legacy = fresh("BEAM_AGENTS_FRESH_LEGACY_RESULT");
    assertEquals(
        Verification.VALID, verify(legacy, RESULT, ring, end.minus(Duration.ofMillis(1))));
    assertEquals(Verification.LEGACY_EXPIRED, verify(legacy, RESULT, ring, end));
  }
}
