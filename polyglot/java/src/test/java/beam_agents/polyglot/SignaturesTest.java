package beam_agents.polyglot;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import beam_agents.polyglot.Signatures.Verification;
import com.google.protobuf.InvalidProtocolBufferException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Base64;
import java.util.Map;
import org.junit.jupiter.api.Test;

class SignaturesTest {
  /** The published golden test key (golden/v<N>/builders.py): never a production secret. */
  private static final Map<String, byte[]> GOLDEN_KEYS =
      Map.of(
          "golden-2026-11",
          "beam_agents golden corpus test key, not a secret".getBytes(StandardCharsets.UTF_8));

  private static byte[] goldenSigned() throws Exception {
    return Files.readAllBytes(Golden.dir().resolve("tool_intent_signed.binpb"));
  }

  @Test
  void theGoldenSignedIntentVerifiesUnderTheGoldenKey() throws Exception {
    assertEquals(Verification.VALID, Signatures.verify(goldenSigned(), GOLDEN_KEYS));
    assertEquals(
        Verification.UNKNOWN_KEY,
        Signatures.verify(goldenSigned(), Map.of("other", new byte[32])));
  }

  @Test
  void aOneByteChangeAnywhereDoesNotVerify() throws Exception {
    byte[] signed = goldenSigned();
    for (int position = 0; position < signed.length; position++) {
      byte[] changed = signed.clone();
      changed[position] ^= 0x01;
      Verification outcome;
      try {
        outcome = Signatures.verify(changed, GOLDEN_KEYS);
      } catch (InvalidProtocolBufferException e) {
        continue; // no longer an intent at all
      }
      assertNotEquals(Verification.VALID, outcome, "a change at byte " + position);
    }
  }

  @Test
  void unsignedAndWrongLengthSignaturesAreRefused() throws Exception {
    byte[] signed = goldenSigned();
    assertEquals(
        Verification.UNSIGNED, Signatures.verify(Signatures.stripSignature(signed), GOLDEN_KEYS));
    // The signature is the last field: cut one byte of it and fix its length prefix.
    byte[] shorter = java.util.Arrays.copyOf(signed, signed.length - 1);
    shorter[shorter.length - 32] = 31;
    assertEquals(Verification.BAD_SIGNATURE, Signatures.verify(shorter, GOLDEN_KEYS));
  }

  /** Runs when polyglot_test.py signs an intent with a fresh key and passes the files. */
  @Test
  void anIntentSignedInPythonVerifies() throws Exception {
    String path = System.getenv("BEAM_AGENTS_FRESH_INTENT");
    String key = System.getenv("BEAM_AGENTS_FRESH_KEY");
    assumeTrue(path != null && key != null, "run from polyglot/polyglot_test.py");
    Map<String, byte[]> keys =
        Map.of(System.getenv("BEAM_AGENTS_FRESH_KEY_ID"), Base64.getDecoder().decode(key));
    byte[] data = Files.readAllBytes(Path.of(path));
    assertEquals(Verification.VALID, Signatures.verify(data, keys));
    data[data.length / 2] ^= 0x01;
    assertNotEquals(Verification.VALID, Signatures.verify(data, keys));
  }
}
