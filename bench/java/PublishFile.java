// Sends pre-encoded messages with a plain KafkaProducer: bench/publish.py's baseline.
// The file holds records as [int32 key length][key][int32 value length][value], big-endian.
// Usage: java -cp 'kafka-clients jars:classes' PublishFile FILE TOPIC key=value...
// Prints one JSON line: records acknowledged, errors, seconds from the first send to the last ack.
import java.io.BufferedInputStream;
import java.io.DataInputStream;
import java.io.EOFException;
import java.io.FileInputStream;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class PublishFile {
  public static void main(String[] args) throws Exception {
    List<byte[]> keys = new ArrayList<>();
    List<byte[]> values = new ArrayList<>();
    try (DataInputStream in =
        new DataInputStream(new BufferedInputStream(new FileInputStream(args[0]), 1 << 20))) {
      while (true) {
        int keyLength;
        try {
          keyLength = in.readInt();
        } catch (EOFException end) {
          break;
        }
        byte[] key = new byte[keyLength];
        in.readFully(key);
        byte[] value = new byte[in.readInt()];
        in.readFully(value);
        keys.add(key);
        values.add(value);
      }
    }
    Properties props = new Properties();
    for (int i = 2; i < args.length; i++) {
      int eq = args[i].indexOf('=');
      props.put(args[i].substring(0, eq), args[i].substring(eq + 1));
    }
    AtomicLong acked = new AtomicLong();
    AtomicLong errors = new AtomicLong();
    AtomicLong lastAck = new AtomicLong();
    long start;
    try (KafkaProducer<byte[], byte[]> producer =
        new KafkaProducer<>(props, new ByteArraySerializer(), new ByteArraySerializer())) {
      start = System.nanoTime();
      for (int i = 0; i < values.size(); i++) {
        producer.send(
            new ProducerRecord<>(args[1], keys.get(i), values.get(i)),
            (metadata, error) -> {
              if (error != null) errors.incrementAndGet();
              else acked.incrementAndGet();
              lastAck.set(System.nanoTime());
            });
      }
      producer.flush();
    }
    System.out.printf(
        "{\"records\": %d, \"errors\": %d, \"seconds\": %.6f}%n",
        acked.get(), errors.get(), (lastAck.get() - start) / 1e9);
  }
}
