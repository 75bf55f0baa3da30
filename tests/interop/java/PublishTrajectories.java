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
        GenericRecord r = new GenericData.Record(schema);
        String group = "java-group-" + (i / 4);
        r.put("trajectory_id", "java-" + i);
        r.put("group_id", group);
        r.put("sample_index", i % 4);
        r.put("group_size", 4);
        r.put("domain", "math/java-000");
        r.put("task_type", "math");
        r.put("policy_version", 3L);
        r.put("prompt_tokens", ints(1, 2, 3, i));
        r.put("response_tokens", ints(7, i));
        r.put("response_logprobs", floats(-0.5f, -1.5f));
        r.put("response_text", "Answer: " + i);
        r.put("finish_reason", "stop");
        r.put("expected_answer", Integer.toString(i));
        r.put("unit_tests", null);
        r.put("gold_fields", null);
        r.put("precomputed_reward", null);
        r.put("worker_id", "java-worker");
        r.put("created_at", 1764504000000L + i);
        r.put("metadata", Map.of("lang", "java"));
        byte[] value = encoder.encode(r).array();
        producer.send(new ProducerRecord<>(args[2], group.getBytes("UTF-8"), value)).get();
      }
    }
  }
}
