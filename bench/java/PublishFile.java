// Sends pre-encoded messages with a plain KafkaProducer: bench/publish.py's baseline.
// The file holds records as [int32 key length][key][int32 value length][value], big-endian.
// Usage: java -cp 'kafka-clients jars:classes' PublishFile FILE TOPIC key=value...
// Prints one JSON line: records acknowledged, errors, seconds from the first send to the last ack,
// and CPU seconds over that window: the sending thread's, and the whole JVM's (start-up excluded).
import java.io.BufferedInputStream;
import java.io.DataInputStream;
import java.io.EOFException;
import java.io.FileInputStream;
import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;
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
    ThreadMXBean threads = ManagementFactory.getThreadMXBean();
    com.sun.management.OperatingSystemMXBean os =
        (com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean();
    long start;
    long threadCpu;
    long processCpu;
    try (KafkaProducer<byte[], byte[]> producer =
        new KafkaProducer<>(props, new ByteArraySerializer(), new ByteArraySerializer())) {
      processCpu = os.getProcessCpuTime();
      threadCpu = threads.getCurrentThreadCpuTime();
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
      threadCpu = threads.getCurrentThreadCpuTime() - threadCpu;
      processCpu = os.getProcessCpuTime() - processCpu;
    }
    System.out.printf(
        "{\"records\": %d, \"errors\": %d, \"seconds\": %.6f, \"thread_cpu_s\": %.6f,"
            + " \"window_cpu_s\": %.6f}%n",
        acked.get(), errors.get(), (lastAck.get() - start) / 1e9, threadCpu / 1e9, processCpu / 1e9);
  }
}
