// Writes ledgers with Apache BookKeeper's own Java client, the way a Pulsar broker's managed ledger does:
// CRC32C digests, a password, Pulsar's custom metadata, a few entries each, most ledgers closed.
//
// Run in Java's source-launch mode (no build step), with the jars of infra/jars/bookkeeper:
//   java -cp '.jars/bookkeeper/*' infra/bookkeeper/LedgerWriter.java --conf client.conf --ledgers 100 \
//        --entries 5 --ensemble 3 --write-quorum 2 --ack-quorum 2 --open 2 --topic-prefix tenant/ns/persistent/t
// The client settings (metadata service, placement policy, rack mapping script) come from --conf.
// Prints one JSON line: {"closed": [ids], "open": [ids], "seconds": s}. Exit 2 with one line on failure.

import java.io.File;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;
import org.apache.bookkeeper.client.api.BookKeeper;
import org.apache.bookkeeper.client.api.DigestType;
import org.apache.bookkeeper.client.api.WriteHandle;
import org.apache.bookkeeper.conf.ClientConfiguration;

public class LedgerWriter {
    public static void main(String[] args) throws Exception {
        Map<String, String> opts = parse(args);
        ClientConfiguration conf = new ClientConfiguration();
        conf.loadConf(new File(opts.get("conf")).toURI().toURL());
        int ledgers = Integer.parseInt(opts.getOrDefault("ledgers", "10"));
        int entries = Integer.parseInt(opts.getOrDefault("entries", "3"));
        int ensemble = Integer.parseInt(opts.getOrDefault("ensemble", "3"));
        int writeQuorum = Integer.parseInt(opts.getOrDefault("write-quorum", "2"));
        int ackQuorum = Integer.parseInt(opts.getOrDefault("ack-quorum", "2"));
        int open = Integer.parseInt(opts.getOrDefault("open", "0"));
        int inFlight = Integer.parseInt(opts.getOrDefault("in-flight", "64"));
        String prefix = opts.getOrDefault("topic-prefix", "public/default/persistent/topic");
        byte[] password = opts.getOrDefault("password", "bkaudit-writer").getBytes(StandardCharsets.UTF_8);
        long started = System.nanoTime();
        List<Long> closed = Collections.synchronizedList(new ArrayList<>());
        List<Long> opened = Collections.synchronizedList(new ArrayList<>());
        List<WriteHandle> keptOpen = Collections.synchronizedList(new ArrayList<>());
        Semaphore slots = new Semaphore(inFlight);
        List<CompletableFuture<Void>> all = new ArrayList<>();
        try (BookKeeper bk = BookKeeper.newBuilder(conf).build()) {
            for (int i = 0; i < ledgers; i++) {
                slots.acquire();
                boolean leaveOpen = i >= ledgers - open;
                Map<String, byte[]> metadata = new HashMap<>();
                metadata.put("application", bytes("pulsar"));
                metadata.put("component", bytes("managed-ledger"));
                metadata.put("pulsar/managed-ledger", bytes(prefix + "-" + (i % 50)));
                if (opts.containsKey("custom-key")) {
                    metadata.put(opts.get("custom-key"), bytes(opts.getOrDefault("custom-value", "")));
                }
                CompletableFuture<Void> done = bk.newCreateLedgerOp()
                        .withEnsembleSize(ensemble).withWriteQuorumSize(writeQuorum).withAckQuorumSize(ackQuorum)
                        .withDigestType(DigestType.CRC32C).withPassword(password).withCustomMetadata(metadata)
                        .execute()
                        .thenCompose(handle -> appendAll(handle, entries))
                        .thenCompose(handle -> {
                            if (leaveOpen) {
                                opened.add(handle.getId());
                                keptOpen.add(handle);
                                return CompletableFuture.completedFuture(null);
                            }
                            closed.add(handle.getId());
                            return handle.closeAsync();
                        });
                done.whenComplete((ignored, error) -> slots.release());
                all.add(done);
            }
            CompletableFuture.allOf(all.toArray(new CompletableFuture[0])).get(10, TimeUnit.MINUTES);
            // Open ledgers stay open in their metadata: the client goes away without closing them.
        } catch (Exception error) {
            Throwable cause = error.getCause() != null ? error.getCause() : error;
            System.err.println("LedgerWriter: " + cause);
            System.exit(2);
        }
        double seconds = (System.nanoTime() - started) / 1e9;
        Collections.sort(closed);
        Collections.sort(opened);
        System.out.println("{\"closed\": " + closed + ", \"open\": " + opened + ", \"seconds\": " + seconds + "}");
        System.exit(0);  // the open handles' threads must not keep the JVM alive
    }

    private static CompletableFuture<WriteHandle> appendAll(WriteHandle handle, int entries) {
        CompletableFuture<Long> chain = CompletableFuture.completedFuture(-1L);
        for (int e = 0; e < entries; e++) {
            byte[] payload = ("entry-" + handle.getId() + "-" + e).getBytes(StandardCharsets.UTF_8);
            chain = chain.thenCompose(previous -> handle.appendAsync(payload));
        }
        return chain.thenApply(last -> handle);
    }

    private static byte[] bytes(String text) {
        return text.getBytes(StandardCharsets.UTF_8);
    }

    private static Map<String, String> parse(String[] args) {
        Map<String, String> opts = new HashMap<>();
        for (int i = 0; i + 1 < args.length; i += 2) {
            if (!args[i].startsWith("--")) {
                throw new IllegalArgumentException("expected --name value pairs, got " + args[i]);
            }
            opts.put(args[i].substring(2), args[i + 1]);
        }
        if (!opts.containsKey("conf")) {
            throw new IllegalArgumentException("--conf FILE (a BookKeeper client configuration) is required");
        }
        return opts;
    }
}
