// Publishes trajectories the way a Java rollout worker would, knowing only
// schemas/avro/trajectory.avsc and schemas/WIRE_FORMAT.md.
// Usage: java -cp 'deps/*' PublishTrajectories.java SCHEMA BOOTSTRAP TOPIC COUNT
import java.io.File;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.Map;
import java.util.Properties;
import org.apache.avro.Schema;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.generic.GenericRecordBuilder;
import org.apache.avro.message.BinaryMessageEncoder;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class PublishTrajectories {
  static ByteBuffer ints(int... values) {
    ByteBuffer b = ByteBuffer.allocate(4 * values.length).order(ByteOrder.LITTLE_ENDIAN);
    for (int v : values) b.putInt(v);
    return b.flip();
  }

  static ByteBuffer floats(float... values) {
    ByteBuffer b = ByteBuffer.allocate(4 * values.length).order(ByteOrder.LITTLE_ENDIAN);
    for (float v : values) b.putFloat(v);
    return b.flip();
  }

  public static void main(String[] args) throws Exception {
    Schema schema = new Schema.Parser().parse(new File(args[0]));
    int count = Integer.parseInt(args[3]);
    BinaryMessageEncoder<GenericRecord> encoder = new BinaryMessageEncoder<>(GenericData.get(), schema);
    Properties props = new Properties();
    props.put("bootstrap.servers", args[1]);
    props.put("enable.idempotence", "true");
    props.put("acks", "all");
    props.put("compression.type", "lz4");
    try (KafkaProducer<byte[], byte[]> producer =
        new KafkaProducer<>(props, new ByteArraySerializer(), new ByteArraySerializer())) {
      for (int i = 0; i < count; i++) {
        // The builder fills every field left unset with its schema default (task_id, attempt, ...).
        GenericRecordBuilder r = new GenericRecordBuilder(schema);
        String group = "java-group-" + (i / 4);
        r.set("trajectory_id", "java-" + i);
        r.set("group_id", group);
        r.set("sample_index", i % 4);
        r.set("group_size", 4);
        r.set("domain", "math/java-000");
        r.set("task_type", "math");
        r.set("policy_version", 3L);
        r.set("prompt_tokens", ints(1, 2, 3, i));
        r.set("response_tokens", ints(7, i));
        r.set("response_logprobs", floats(-0.5f, -1.5f));
        r.set("response_text", "Answer: " + i);
        r.set("finish_reason", "stop");
        r.set("expected_answer", Integer.toString(i));
        r.set("unit_tests", null);
        r.set("gold_fields", null);
        r.set("precomputed_reward", null);
        r.set("worker_id", "java-worker");
        r.set("created_at", 1764504000000L + i);
        r.set("metadata", Map.of("lang", "java"));
        byte[] value = encoder.encode(r.build()).array();
        producer.send(new ProducerRecord<>(args[2], group.getBytes("UTF-8"), value)).get();
      }
    }
  }
}
