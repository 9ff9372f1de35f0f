package beam_agents.polyglot;

import beam_agents.v1.BeamAgents;
import com.google.protobuf.Descriptors.Descriptor;
import com.google.protobuf.Descriptors.FieldDescriptor;
import com.google.protobuf.Message;
import com.google.protobuf.UnknownFieldSet;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/** The golden corpus, read the way any Java service reads beam_agents messages. */
final class Golden {
  record Fixture(String name, Message decoded, Message knownFieldsOnly, String text) {}

  private static final Pattern TYPE_HEADER = Pattern.compile("(?m)^# proto-message: (\\S+)$");
  private static final Pattern VERSION_DIR = Pattern.compile("v([1-9][0-9]*)");

  private Golden() {}

  /**
   * The newest corpus folder: $BEAM_AGENTS_GOLDEN, else the repository's golden/v&lt;N&gt; with the
   * highest N (older ones are frozen, and the newest holds every fixture name they do).
   */
  static Path dir() {
    String given = System.getenv("BEAM_AGENTS_GOLDEN");
    if (given != null) {
      return Path.of(given);
    }
    Path root = Path.of("..", "..", "golden");
    Path newest = null;
    int newestVersion = 0;
    try (DirectoryStream<Path> folders = Files.newDirectoryStream(root, Files::isDirectory)) {
      for (Path folder : folders) {
        Matcher version = VERSION_DIR.matcher(folder.getFileName().toString());
        if (version.matches() && Integer.parseInt(version.group(1)) > newestVersion) {
          newestVersion = Integer.parseInt(version.group(1));
          newest = folder;
        }
      }
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
    if (newest == null) {
      throw new IllegalStateException("no golden/v<N> folder under " + root);
    }
    return newest;
  }

  static List<Fixture> fixtures() {
    List<Fixture> found = new ArrayList<>();
    try (DirectoryStream<Path> paths = Files.newDirectoryStream(dir(), "*.binpb")) {
      for (Path path : paths) {
        String name = path.getFileName().toString();
        String text =
            Files.readString(
                path.resolveSibling(name.replace(".binpb", ".textproto")), StandardCharsets.UTF_8);
        Matcher header = TYPE_HEADER.matcher(text);
        if (!header.find()) {
          throw new IllegalStateException(name + " names no proto-message");
        }
        Message prototype = defaultInstance(header.group(1));
        Message decoded = prototype.getParserForType().parseFrom(Files.readAllBytes(path));
        found.add(new Fixture(name, decoded, withoutUnknown(decoded), text));
      }
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
    if (found.isEmpty()) {
      throw new IllegalStateException("no golden fixtures under " + dir());
    }
    return found;
  }

  /** A copy with unknown fields dropped at every depth: the text format holds known ones only. */
  static Message withoutUnknown(Message message) {
    Message.Builder builder = message.toBuilder().setUnknownFields(UnknownFieldSet.getDefaultInstance());
    for (Map.Entry<FieldDescriptor, Object> field : message.getAllFields().entrySet()) {
      FieldDescriptor descriptor = field.getKey();
      if (descriptor.getJavaType() != FieldDescriptor.JavaType.MESSAGE) {
        continue;
      }
      if (descriptor.isRepeated()) {
        List<?> values = (List<?>) field.getValue();
        for (int i = 0; i < values.size(); i++) {
          builder.setRepeatedField(descriptor, i, withoutUnknown((Message) values.get(i)));
        }
      } else {
        builder.setField(descriptor, withoutUnknown((Message) field.getValue()));
      }
    }
    return builder.build();
  }

  /** The generated class's default instance for a full name such as beam_agents.v1.ToolIntent. */
  static Message defaultInstance(String fullName) {
    for (Descriptor type : BeamAgents.getDescriptor().getMessageTypes()) {
      if (type.getFullName().equals(fullName)) {
        try {
          Class<?> generated = Class.forName(BeamAgents.class.getName() + "$" + type.getName());
          return (Message) generated.getMethod("getDefaultInstance").invoke(null);
        } catch (ReflectiveOperationException e) {
          throw new IllegalStateException(fullName, e);
        }
      }
    }
    throw new IllegalArgumentException("no message " + fullName);
  }
}
