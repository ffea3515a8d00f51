package brokerlens.interceptor;

import java.io.IOException;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.time.Instant;
import java.util.HashMap;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.LongAdder;
import javax.servlet.FilterChain;
import javax.servlet.ServletException;
import javax.servlet.ServletRequest;
import javax.servlet.ServletResponse;
import javax.servlet.http.HttpServletRequest;
import javax.servlet.http.HttpServletResponse;
import org.apache.bookkeeper.mledger.Entry;
import org.apache.pulsar.broker.PulsarService;
import org.apache.pulsar.broker.ServiceConfiguration;
import org.apache.pulsar.broker.authentication.AuthenticationDataSource;
import org.apache.pulsar.broker.intercept.BrokerInterceptor;
import org.apache.pulsar.broker.service.AbstractTopic;
import org.apache.pulsar.broker.service.Consumer;
import org.apache.pulsar.broker.service.Dispatcher;
import org.apache.pulsar.broker.service.RedeliveryTracker;
import org.apache.pulsar.broker.service.RedeliveryTrackerDisabled;
import org.apache.pulsar.broker.service.ServerCnx;
import org.apache.pulsar.broker.service.Subscription;
import org.apache.pulsar.broker.service.Topic;
import org.apache.pulsar.broker.web.AuthenticationFilter;
import org.apache.pulsar.common.api.proto.BaseCommand;
import org.apache.pulsar.common.api.proto.MessageMetadata;
import org.apache.pulsar.common.policies.data.DispatchRate;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * brokerlens' dispatch exporter: per rate period, what each subscription, topic (partition) and
 * the broker dispatched (messages, bytes, entries, redelivered messages), served as JSON lines in
 * the {@code dispatch} landing format at {@link #PATH} (docs/interceptor.md).
 *
 * <p>Pulsar 4.0.7 calls {@link #beforeSendMessage(Subscription, Entry, long[], MessageMetadata,
 * Consumer)} from {@code AbstractBaseDispatcher.filterEntriesForConsumer}, once per entry that
 * passed the entry filters, markers and delayed delivery, for every dispatcher (persistent single
 * active consumer, shared, key_shared, their classic variants, and the non-persistent ones), just
 * before the dispatcher acquires dispatch-rate permits and hands the entries to
 * {@code Consumer.sendMessages}. The metadata is the entry's (batch) metadata, so one call is one
 * entry of {@code numMessagesInBatch} messages.
 */
public class DispatchInterceptor implements BrokerInterceptor {
    private static final Logger log = LoggerFactory.getLogger(DispatchInterceptor.class);

    /** Inside the /admin/v2 context, so the request passes Pulsar's filters there (this one answers it). */
    public static final String PATH = "/admin/v2/brokerlens/dispatch";
    static final long DEFAULT_MAX_RECORDS = 200_000;
    static final long DEFAULT_MAX_BYTES = 64L << 20;
    static final long DEFAULT_IDLE_EVICT_SECONDS = 60;
    /** A second is flushed this long after it closed, so dispatch calls that read the clock just
     * before the boundary have added their counts. */
    static final long FLUSH_GRACE_MS = 300;

    private final ConcurrentHashMap<Subscription, SubscriptionCounters> counters = new ConcurrentHashMap<>();
    private final LongAdder errors = new LongAdder();
    private final LongAdder late = new LongAdder();
    private final LongAdder flushErrors = new LongAdder();
    private final long epoch = System.currentTimeMillis();

    private PulsarService pulsar;
    private RecordBuffer buffer;
    private ScheduledExecutorService flusher;
    private String cluster;
    private String broker;
    private long idleEvictSeconds;
    private long nextSecond;
    /** Open windows of periods longer than one second, by scope key; flusher thread only. */
    private final Map<String, Window> windows = new LinkedHashMap<>();

    // ---- lifecycle -------------------------------------------------------------------------

    @Override
    public void initialize(PulsarService pulsarService) {
        this.pulsar = pulsarService;
        ServiceConfiguration conf = pulsarService.getConfiguration();
        Properties props = conf.getProperties();
        long maxRecords = longProperty(props, "brokerlensDispatchBufferMaxRecords", DEFAULT_MAX_RECORDS);
        long maxBytes = longProperty(props, "brokerlensDispatchBufferMaxBytes", DEFAULT_MAX_BYTES);
        this.idleEvictSeconds = longProperty(props, "brokerlensDispatchIdleEvictSeconds", DEFAULT_IDLE_EVICT_SECONDS);
        this.buffer = new RecordBuffer(maxRecords, maxBytes);
        this.cluster = conf.getClusterName();
        // The admin API names a broker advertisedAddress:webServicePort (PulsarService's brokerId,
        // set in start() before the interceptor is initialized).
        String id;
        try {
            id = pulsarService.getBrokerId();
        } catch (RuntimeException e) {
            id = conf.getAdvertisedAddress() + ":" + conf.getWebServicePort().orElse(0);
        }
        this.broker = id;
        this.nextSecond = System.currentTimeMillis() / 1000;
        this.flusher = Executors.newSingleThreadScheduledExecutor(r -> {
            Thread t = new Thread(r, "brokerlens-dispatch-flusher");
            t.setDaemon(true);
            return t;
        });
        flusher.scheduleWithFixedDelay(this::tick, 100, 100, TimeUnit.MILLISECONDS);
        log.info("brokerlens dispatch interceptor initialized: broker={} cluster={} path={} buffer={} records / {} bytes",
                broker, cluster, PATH, maxRecords, maxBytes);
    }

    @Override
    public void close() {
        if (flusher != null) {
            flusher.shutdownNow();
        }
    }

    private static long longProperty(Properties props, String key, long fallback) {
        Object value = props == null ? null : props.get(key);
        if (value == null) {
            return fallback;
        }
        try {
            return Long.parseLong(value.toString().trim());
        } catch (NumberFormatException e) {
            log.warn("brokerlens: {}={} is not a number, using {}", key, value, fallback);
            return fallback;
        }
    }

    // ---- the dispatch path -----------------------------------------------------------------

    @Override
    public void beforeSendMessage(Subscription subscription, Entry entry, long[] ackSet, MessageMetadata msgMetadata,
                                  Consumer consumer) {
        try {
            long second = System.currentTimeMillis() / 1000;
            SubscriptionCounters c = counters.get(subscription);
            if (c == null) {
                c = counters.computeIfAbsent(subscription, s -> new SubscriptionCounters(s, second));
            }
            // The dispatcher counts numMessagesInBatch per entry (1 when not batched); an ack set
            // (from the cursor's batch-deleted indexes) has a bit set per index still to deliver,
            // as Consumer.sendMessages reads it.
            long msgs = msgMetadata == null ? 1 : msgMetadata.getNumMessagesInBatch();
            if (ackSet != null) {
                long remaining = 0;
                for (long word : ackSet) {
                    remaining += Long.bitCount(word);
                }
                msgs = Math.min(msgs, remaining);
            }
            long redelivered = isRedelivery(c, subscription, entry) ? msgs : 0;
            if (!c.add(second, msgs, entry.getLength(), redelivered)) {
                late.increment();
            }
        } catch (Throwable t) {
            errors.increment();
        }
    }

    /**
     * Shared and Key_Shared dispatchers keep an {@code InMemoryRedeliveryTracker} whose count for
     * a position is raised when a consumer's unacknowledged messages are redelivered (negative
     * ack, ack timeout, consumer closed): the broker sends that count to the client as the
     * message's redelivery count, so "redelivered" here is what the client sees. Exclusive and
     * Failover dispatchers have {@code RedeliveryTrackerDisabled} (always 0) and redeliver by
     * rewinding the cursor, so for them an entry at or below the highest position already
     * dispatched to the subscription counts as redelivered (a seek back counts too). Non-persistent
     * topics never redeliver.
     */
    private static boolean isRedelivery(SubscriptionCounters c, Subscription subscription, Entry entry) {
        if (!c.persistent) {
            return false;
        }
        long ledger = entry.getLedgerId();
        long entryId = entry.getEntryId();
        Dispatcher dispatcher = subscription.getDispatcher();
        RedeliveryTracker tracker = dispatcher == null ? null : dispatcher.getRedeliveryTracker();
        if (tracker != null && !(tracker instanceof RedeliveryTrackerDisabled)) {
            return tracker.getRedeliveryCount(ledger, entryId) > 0;
        }
        long hl = c.highLedger;
        if (ledger < hl || (ledger == hl && entryId <= c.highEntry)) {
            return true;
        }
        // One dispatch thread per subscription at a time in practice; a race here can only make
        // the mark lower, never lose a count.
        c.highLedger = ledger;
        c.highEntry = entryId;
        return false;
    }

    @Override
    public void consumerCreated(ServerCnx cnx, Consumer consumer, Map<String, String> metadata) {
        try {
            // A subscription gets a record for each second a consumer was connected, zero when
            // nothing was dispatched: starved periods are visible.
            Subscription s = consumer.getSubscription();
            if (s != null) {
                counters.computeIfAbsent(s, k -> new SubscriptionCounters(k, System.currentTimeMillis() / 1000));
            }
        } catch (Throwable t) {
            errors.increment();
        }
    }

    // ---- the flusher -----------------------------------------------------------------------

    private void tick() {
        try {
            long now = System.currentTimeMillis();
            while ((nextSecond + 1) * 1000 + FLUSH_GRACE_MS <= now) {
                flushSecond(nextSecond);
                nextSecond++;
            }
            evictIdle(now / 1000);
        } catch (Throwable t) {
            flushErrors.increment();
            log.warn("brokerlens: flush failed", t);
        }
    }

    private void flushSecond(long second) {
        long[] got = new long[4];
        Map<String, long[]> topicSums = new LinkedHashMap<>();
        Map<String, Topic> topics = new HashMap<>();
        Map<String, long[]> subSums = new LinkedHashMap<>();
        Map<String, SubscriptionCounters> subs = new HashMap<>();
        long[] brokerSum = new long[4];
        boolean any = false;
        for (SubscriptionCounters c : counters.values()) {
            boolean had = c.harvest(second, got);
            if (!had) {
                if (!connectedDuring(c.subscription, second)) {
                    continue;
                }
                java.util.Arrays.fill(got, 0);
            }
            any = true;
            String key = c.topic + "\u0000" + c.name;
            add(subSums.computeIfAbsent(key, k -> new long[4]), got);
            subs.putIfAbsent(key, c);
            add(topicSums.computeIfAbsent(c.topic, k -> new long[4]), got);
            topics.putIfAbsent(c.topic, c.subscription.getTopic());
            add(brokerSum, got);
        }
        for (Map.Entry<String, long[]> e : subSums.entrySet()) {
            SubscriptionCounters c = subs.get(e.getKey());
            int period = subscriptionPeriod(c);
            accumulate("s\u0000" + e.getKey(), "subscription", c.topic, c.name, period, second, e.getValue());
        }
        for (Map.Entry<String, long[]> e : topicSums.entrySet()) {
            int period = topicPeriod(topics.get(e.getKey()));
            accumulate("t\u0000" + e.getKey(), "topic", e.getKey(), null, period, second, e.getValue());
        }
        if (any) {
            // The broker-level limiter is built with ratePeriodInSecond(1) (DispatchRateLimiter).
            accumulate("b", "broker", null, null, 1, second, brokerSum);
        }
        // Windows of longer periods that ended without activity in their last second.
        for (Iterator<Window> it = windows.values().iterator(); it.hasNext(); ) {
            Window w = it.next();
            if (w.start + w.period - 1 <= second) {
                emit(w);
                it.remove();
            }
        }
    }

    private static void add(long[] into, long[] counts) {
        for (int i = 0; i < 4; i++) {
            into[i] += counts[i];
        }
    }

    /** The period of the subscription dispatch-rate policy in force (subscription, topic, namespace, broker). */
    private static int subscriptionPeriod(SubscriptionCounters c) {
        try {
            Topic topic = c.subscription.getTopic();
            if (topic instanceof AbstractTopic at) {
                return positive(at.getSubscriptionDispatchRate(c.name));
            }
        } catch (Throwable ignored) {
            // fall through: the broker default
        }
        return 1;
    }

    private static int topicPeriod(Topic topic) {
        try {
            if (topic instanceof AbstractTopic at) {
                return positive(at.getDispatchRate());
            }
        } catch (Throwable ignored) {
            // fall through: the broker default
        }
        return 1;
    }

    private static int positive(DispatchRate rate) {
        return rate == null || rate.getRatePeriodInSecond() <= 0 ? 1 : rate.getRatePeriodInSecond();
    }

    private static final class Window {
        final String level;
        final String topic;
        final String subscription;
        final long start;
        final int period;
        final long[] sums = new long[4];

        Window(String level, String topic, String subscription, long start, int period) {
            this.level = level;
            this.topic = topic;
            this.subscription = subscription;
            this.start = start;
            this.period = period;
        }
    }

    /** Periods are aligned to multiples of their length since the epoch (the limiter's own refill
     * instants are not observable from here). */
    private void accumulate(String key, String level, String topic, String subscription, int period, long second,
                            long[] counts) {
        long start = second - Math.floorMod(second, period);
        Window w = windows.get(key);
        if (w != null && (w.start != start || w.period != period)) {
            emit(w);
            windows.remove(key);
            w = null;
        }
        if (w == null) {
            w = new Window(level, topic, subscription, start, period);
            if (period > 1) {
                windows.put(key, w);
            }
        }
        add(w.sums, counts);
        if (second == start + period - 1) {
            windows.remove(key);
            emit(w);
        }
    }

    private void emit(Window w) {
        long seq = buffer.nextSeq();
        StringBuilder sb = new StringBuilder(256);
        sb.append("{\"period_start\":\"").append(Instant.ofEpochSecond(w.start)).append('"');
        sb.append(",\"period_seconds\":").append(w.period);
        sb.append(",\"level\":\"").append(w.level).append('"');
        sb.append(",\"cluster\":");
        Json.string(sb, cluster);
        sb.append(",\"broker\":");
        Json.string(sb, broker);
        if (w.topic != null) {
            sb.append(",\"topic\":");
            Json.string(sb, w.topic);
        }
        if (w.subscription != null) {
            sb.append(",\"subscription\":");
            Json.string(sb, w.subscription);
        }
        sb.append(",\"msgs\":").append(w.sums[0]);
        sb.append(",\"bytes\":").append(w.sums[1]);
        sb.append(",\"entries\":").append(w.sums[2]);
        sb.append(",\"redelivered_msgs\":").append(w.sums[3]);
        sb.append(",\"source\":\"exporter\",\"seq\":").append(seq).append('}');
        buffer.add(seq, sb.toString());
    }

    /**
     * A consumer connected now was connected during {@code second}: it connected before the second
     * ended. The flusher runs after the second has closed, so a consumer that connected since (a
     * subscribe-then-close within the flush grace) must not give the closed second a zero record.
     */
    private static boolean connectedDuring(Subscription subscription, long second) {
        long end = (second + 1) * 1000;
        for (Consumer consumer : subscription.getConsumers()) {
            Instant since = consumer.getConnectedSince();
            if (since == null || since.toEpochMilli() < end) {
                return true;
            }
        }
        return false;
    }

    private void evictIdle(long nowSecond) {
        for (Iterator<SubscriptionCounters> it = counters.values().iterator(); it.hasNext(); ) {
            SubscriptionCounters c = it.next();
            if (c.lastActiveSecond < nowSecond - idleEvictSeconds && c.subscription.getConsumers().isEmpty()
                    && c.drained()) {
                it.remove();
            }
        }
    }

    // ---- the HTTP route --------------------------------------------------------------------

    /**
     * Pulsar's WebService adds a ProcessHandlerFilter per interceptor to every servlet context
     * (/admin/v2 among them), before its AuthenticationFilter: so this filter authenticates the
     * request itself with the broker's AuthenticationService (the admin API's providers), and
     * with authorization enabled requires a superuser role, as the admin API's broker endpoints
     * do. Any other path goes on down the chain untouched.
     */
    @Override
    public void onFilter(ServletRequest request, ServletResponse response, FilterChain chain)
            throws IOException, ServletException {
        if (!(request instanceof HttpServletRequest req) || !(response instanceof HttpServletResponse resp)
                || !PATH.equals(req.getRequestURI())) {
            chain.doFilter(request, response);
            return;
        }
        try {
            serve(req, resp);
        } catch (Throwable t) {
            log.warn("brokerlens: serving {} failed", PATH, t);
            if (!resp.isCommitted()) {
                resp.sendError(HttpServletResponse.SC_INTERNAL_SERVER_ERROR, "brokerlens: " + t);
            }
        }
    }

    private void serve(HttpServletRequest req, HttpServletResponse resp) throws Exception {
        if (!"GET".equals(req.getMethod())) {
            resp.sendError(HttpServletResponse.SC_METHOD_NOT_ALLOWED, "GET only");
            return;
        }
        ServiceConfiguration conf = pulsar.getConfiguration();
        if (conf.isAuthenticationEnabled()) {
            boolean proceed;
            try {
                proceed = pulsar.getBrokerService().getAuthenticationService().authenticateHttpRequest(req, resp);
            } catch (Exception e) {
                resp.sendError(HttpServletResponse.SC_UNAUTHORIZED, "Authentication required");
                return;
            }
            if (!proceed) {
                return; // the provider answered (a SASL round trip)
            }
            if (conf.isAuthorizationEnabled()) {
                String role = (String) req.getAttribute(AuthenticationFilter.AuthenticatedRoleAttributeName);
                AuthenticationDataSource data =
                        (AuthenticationDataSource) req.getAttribute(AuthenticationFilter.AuthenticatedDataAttributeName);
                Boolean superUser = role == null ? Boolean.FALSE
                        : pulsar.getBrokerService().getAuthorizationService().isSuperUser(role, data)
                        .get(30, TimeUnit.SECONDS);
                if (!Boolean.TRUE.equals(superUser)) {
                    resp.sendError(HttpServletResponse.SC_FORBIDDEN, "brokerlens: superuser role required");
                    return;
                }
            }
        }
        long after = 0;
        int limit = 100_000;
        try {
            String epochParam = req.getParameter("epoch");
            String afterParam = req.getParameter("after");
            // A sequence from another broker process (the broker restarted) means nothing here:
            // the collector gets everything this process still holds.
            if (afterParam != null && (epochParam == null || Long.parseLong(epochParam) == epoch)) {
                after = Long.parseLong(afterParam);
            }
            if (req.getParameter("limit") != null) {
                limit = Math.max(1, Integer.parseInt(req.getParameter("limit")));
            }
        } catch (NumberFormatException e) {
            resp.sendError(HttpServletResponse.SC_BAD_REQUEST, "after, epoch and limit are integers");
            return;
        }
        RecordBuffer.Page page = buffer.after(after, limit);
        resp.setStatus(HttpServletResponse.SC_OK);
        resp.setContentType("application/x-ndjson");
        resp.setCharacterEncoding("UTF-8");
        resp.setHeader("X-Brokerlens-Epoch", Long.toString(epoch));
        resp.setHeader("X-Brokerlens-Broker", broker);
        resp.setHeader("X-Brokerlens-First-Seq", Long.toString(page.firstSeq()));
        resp.setHeader("X-Brokerlens-Last-Seq", Long.toString(page.lastSeq()));
        resp.setHeader("X-Brokerlens-Dropped-Records", Long.toString(page.dropped()));
        resp.setHeader("X-Brokerlens-Missed-Records", Long.toString(page.missed()));
        resp.setHeader("X-Brokerlens-Dispatch-Errors", Long.toString(errors.sum()));
        resp.setHeader("X-Brokerlens-Late-Counts", Long.toString(late.sum()));
        resp.setHeader("X-Brokerlens-Flush-Errors", Long.toString(flushErrors.sum()));
        resp.setHeader("X-Brokerlens-Subscriptions", Integer.toString(counters.size()));
        byte[] newline = {'\n'};
        OutputStream out = resp.getOutputStream();
        for (RecordBuffer.Rec r : page.records()) {
            out.write(r.line().getBytes(StandardCharsets.UTF_8));
            out.write(newline);
        }
        out.flush();
    }

    // ---- the rest of the interface: nothing to do --------------------------------------------

    @Override
    public void onPulsarCommand(BaseCommand command, ServerCnx cnx) {
    }

    @Override
    public void onConnectionClosed(ServerCnx cnx) {
    }

    @Override
    public void onWebserviceRequest(ServletRequest request) {
    }

    @Override
    public void onWebserviceResponse(ServletRequest request, ServletResponse response) {
    }
}
