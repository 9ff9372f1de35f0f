package beam_agents.polyglot;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import beam_agents.v1.BeamAgents.StateSnapshot;
import beam_agents.v1.BeamAgents.ToolIntent;
import com.google.protobuf.Message;
import com.google.protobuf.TextFormat;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import org.erdtman.jcs.JsonCanonicalizer;
import org.junit.jupiter.api.Test;

class GoldenTest {
  @Test
  void everyGoldenBlobEqualsItsTextprotoFieldByField() throws Exception {
    for (Golden.Fixture fixture : Golden.fixtures()) {
      Message.Builder expected = fixture.decoded().newBuilderForType();
      TextFormat.merge(fixture.text(), expected);
      assertEquals(expected.build(), fixture.knownFieldsOnly(), fixture.name());
    }
  }

  @Test
  void theFutureFieldIntentKeepsItsUnknownFieldThroughAReEncode() throws Exception {
    Golden.Fixture future =
        Golden.fixtures().stream()
            .filter(f -> f.name().equals("tool_intent_future_field.binpb"))
            .findFirst()
            .orElseThrow();
    ToolIntent intent = (ToolIntent) future.decoded();
    assertTrue(intent.getUnknownFields().hasField(20), "unknown field 20 is kept");
    String kept = intent.getUnknownFields().getField(20).getLengthDelimitedList().get(0)
        .toString(StandardCharsets.UTF_8);
    assertEquals("route=eu", kept);
    ToolIntent again = ToolIntent.parseFrom(intent.toByteArray());
    assertEquals(intent, again);
    assertEquals(intent.getUnknownFields(), again.getUnknownFields());
  }

  @Test
  void everyGoldenArgsJsonIsRfc8785Canonical() throws Exception {
    List<ToolIntent> intents = new ArrayList<>();
    for (Golden.Fixture fixture : Golden.fixtures()) {
      if (fixture.decoded() instanceof ToolIntent intent) {
        intents.add(intent);
      } else if (fixture.decoded() instanceof StateSnapshot snapshot) {
        intents.addAll(snapshot.getPendingList());
      }
    }
    assertTrue(intents.size() >= 5, "golden intents: " + intents.size());
    for (ToolIntent intent : intents) {
      String canonical = new JsonCanonicalizer(intent.getArgsJson()).getEncodedString();
      assertEquals(intent.getArgsJson(), canonical, intent.getIntentId());
    }
  }
}
