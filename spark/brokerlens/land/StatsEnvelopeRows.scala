package brokerlens.jvm

import java.util.regex.Pattern

import scala.collection.mutable.ArrayBuffer
import scala.jdk.CollectionConverters._

import com.fasterxml.jackson.core.StreamReadFeature
import com.fasterxml.jackson.core.json.JsonReadFeature
import com.fasterxml.jackson.core.util.ByteArrayBuilder
import com.fasterxml.jackson.databind.{DeserializationFeature, JsonNode, ObjectMapper}
import com.fasterxml.jackson.databind.json.JsonMapper
import com.fasterxml.jackson.databind.node.{BooleanNode, DoubleNode, IntNode, LongNode, TextNode}

import org.apache.spark.sql.SparkSessionExtensions
import org.apache.spark.sql.catalyst.{FunctionIdentifier, InternalRow}
import org.apache.spark.sql.catalyst.expressions.{Expression, ExpressionInfo, GenericInternalRow, TimeZoneAwareExpression, XXH64}
import org.apache.spark.sql.catalyst.expressions.codegen.CodegenFallback
import org.apache.spark.sql.catalyst.parser.CatalystSqlParser
import org.apache.spark.sql.catalyst.util.{DateTimeUtils, GenericArrayData}
import org.apache.spark.sql.types._
import org.apache.spark.unsafe.Platform
import org.apache.spark.unsafe.types.UTF8String

/**
 * Land's one-pass reader of a stats file (topic stats or internal stats in their envelope,
 * land/envelope.py), as the Spark SQL function
 *
 * {{{
 * brokerlens_stats_rows(raw, spec, day_start, day_end)
 * }}}
 *
 * `raw` is a whole file's text, `spec` (a constant JSON string, envelope.py's `read_stats`) names
 * the stats' fields, the children map (`subscriptions`, `cursors`) and the fields of each child
 * (with a child's own checks: a pattern its string must match, a field required unless the topic
 * name starts with a prefix), the keys kept as text, and whether each child's text is kept. The result is the file's bronze rows, or, for a file this reader does not
 * take, one element whose `left` is true: the general parser (envelope.py's `explode_children`,
 * Spark SQL over a VARIANT) reads that file.
 *
 * It takes only files in which that parser finds no problem, and gives exactly its rows: strict
 * JSON (no duplicate key, no trailing text, no NaN, no single quotes), every envelope an object
 * with its required fields, `collected_at` a timestamp string on the day, and each field either
 * absent, null or of its own JSON type (a whole number that fits a long for an integer, also written
 * 800.0 or 3.5E4; any such number or a fraction for a double; `true`/`false`; a string of the enum;
 * for an array of structs of integers, objects whose fields are whole numbers written as such),
 * no negative counter, a child's checks met. Anything else (a number written as a string, `-0.0`, a bad record) is
 * the general parser's, so the quarantine's reasons are its alone. Texts are Jackson's compact
 * rendering of the parsed values, as Spark's `from_json` renders a value read as a string; the
 * envelope's hash is Spark's `xxhash64` of its text.
 */
class StatsEnvelopeRowsExtension extends (SparkSessionExtensions => Unit) {
  override def apply(extensions: SparkSessionExtensions): Unit = {
    val info = new ExpressionInfo(classOf[StatsEnvelopeRows].getName, StatsEnvelopeRows.Name)
    extensions.injectFunction(
      (FunctionIdentifier(StatsEnvelopeRows.Name), info, (args: Seq[Expression]) => StatsEnvelopeRows(args)))
  }
}

/** One field of a stats object: its key, its type (bigint, int, double, boolean, string,
 * array<string>, counted, or an array of structs of bigints, as Pulsar's `ledgers`), whether it is a
 * counter (a negative value is a bad record) or an enum, a pattern its string must match, and a
 * topic-name prefix without which it is required (a persistent topic's cursor has positions). */
final case class StatsField(key: String, kind: String, counter: Boolean, allowed: Set[String], pattern: Option[Pattern],
    requiredUnlessPrefix: Option[String]) {
  val outputType: DataType = kind match {
    case "bigint" => LongType
    case "int" | "array<string>" => IntegerType
    case "double" => DoubleType
    case "boolean" => BooleanType
    case "string" => StringType
    case other =>
      CatalystSqlParser.parseDataType(other) match {
        case a @ ArrayType(StructType(fields), _) if fields.forall(_.dataType == LongType) => a
        case _ => throw new IllegalArgumentException(s"${StatsEnvelopeRows.Name}: field $key has type $other, which it does not read")
      }
  }
  /** The struct fields of an array of structs (empty for the other types). */
  val members: Array[String] = outputType match {
    case ArrayType(StructType(fields), _) => fields.map(_.name)
    case _ => Array.empty
  }
}

/** The mean of a child's array of objects' numeric ``field`` over the values at least ``min``
 * (topic stats: the consumers' ``avgMessagesPerEntry``, silver's messages per entry). */
final case class ChildMean(array: String, field: String, min: Double)

final case class StatsSpec(children: String, topic: Seq[StatsField], child: Seq[StatsField], verbatim: Seq[String], childJson: Boolean,
    childMean: Option[ChildMean]) {
  private def struct(fields: Seq[StatsField]) = StructType(fields.map(f => StructField(f.key, f.outputType)))

  val rowType: StructType = StructType(
    Seq(
      StructField("left", BooleanType),
      StructField("record", IntegerType),
      StructField("hash", LongType),
      StructField("collected_at", TimestampType),
      StructField("cluster", StringType),
      StructField("broker", StringType),
      StructField("topic", StringType),
      StructField("partitioned_topic", StringType),
      StructField("topic_stats", struct(topic)),
      StructField("texts", StructType(verbatim.map(StructField(_, StringType)))),
      StructField("child", StringType),
      StructField("child_stats", struct(child)),
      StructField("child_json", StringType),
      StructField("child_mean", DoubleType)))
}

object StatsSpec {
  def parse(json: String): StatsSpec = {
    val node = new ObjectMapper().readTree(json)
    def fields(name: String) = node.get(name).elements().asScala.toSeq.map { f =>
      val allowed = Option(f.get("enum")).map(_.elements().asScala.map(_.asText).toSet).getOrElse(Set.empty[String])
      def text(key: String) = Option(f.get(key)).filterNot(_.isNull).map(_.asText)
      StatsField(f.get("key").asText, f.get("type").asText, Option(f.get("counter")).exists(_.asBoolean), allowed,
        text("pattern").map(p => Pattern.compile(p)), text("required_unless_prefix"))
    }
    val mean = Option(node.get("child_mean")).filterNot(_.isNull).map(m => ChildMean(m.get("array").asText, m.get("field").asText, m.get("min").asDouble))
    StatsSpec(node.get("children").asText, fields("topic"), fields("child"), node.get("verbatim").elements().asScala.map(_.asText).toSeq,
      Option(node.get("child_json")).forall(_.asBoolean), mean)
  }
}

case class StatsEnvelopeRows(args: Seq[Expression], timeZoneId: Option[String] = None)
    extends Expression with TimeZoneAwareExpression with CodegenFallback {
  import StatsEnvelopeRows._

  override def children: Seq[Expression] = args
  override def nullable: Boolean = false
  override def foldable: Boolean = false

  @transient private lazy val spec: StatsSpec = args match {
    case Seq(_, s, _, _) if s.foldable && s.dataType == StringType => StatsSpec.parse(s.eval().toString)
    case _ => throw new IllegalArgumentException(s"$Usage, not $Name(${args.mkString(", ")})")
  }
  @transient private lazy val dayStart: Long = args(2).eval().asInstanceOf[Long]
  @transient private lazy val dayEnd: Long = args(3).eval().asInstanceOf[Long]

  override def dataType: DataType = ArrayType(spec.rowType, containsNull = false)

  override def withTimeZone(timeZoneId: String): TimeZoneAwareExpression = copy(timeZoneId = Option(timeZoneId))
  override protected def withNewChildrenInternal(newChildren: IndexedSeq[Expression]): Expression = copy(args = newChildren)

  override def eval(input: InternalRow): Any = {
    val raw = args.head.eval(input).asInstanceOf[UTF8String]
    val rows = if (raw == null) None else read(raw)
    new GenericArrayData(rows.getOrElse(Seq(leftRow)).toArray[Any])
  }

  private def leftRow: InternalRow = {
    val row = new GenericInternalRow(spec.rowType.length)
    row.update(0, true)
    row
  }

  /** The file's rows, or None when the general parser must read it. */
  private def read(raw: UTF8String): Option[Seq[InternalRow]] = {
    val root = try Mapper.readTree(raw.getBytes) catch { case _: Exception => return None }
    val envelopes =
      if (root == null || root.isMissingNode) return None
      else if (root.isArray) root.elements().asScala.toSeq
      else Seq(root)
    if (envelopes.isEmpty) return None
    val out = ArrayBuffer.empty[InternalRow]
    var record = 0
    for (envelope <- envelopes) {
      record += 1
      if (!envelopeRows(envelope, record, out)) return None
    }
    Some(out.toSeq)
  }

  private def envelopeRows(envelope: JsonNode, record: Int, out: ArrayBuffer[InternalRow]): Boolean = {
    if (!envelope.isObject) return false
    val collectedAt = envelope.get("collected_at") match {
      case t: TextNode =>
        DateTimeUtils.stringToTimestamp(UTF8String.fromString(t.textValue), zoneId) match {
          case Some(us) if us >= dayStart && us < dayEnd => us
          case _ => return false
        }
      case _ => return false
    }
    val cluster = requiredText(envelope, "cluster").getOrElse(return false)
    val topic = requiredText(envelope, "topic").getOrElse(return false)
    val broker = envelope.get("broker") match {
      case null => null
      case n if n.isNull => null
      case t: TextNode => UTF8String.fromString(t.textValue)
      case _ => return false
    }
    val stats = envelope.get("stats")
    if (stats == null || !stats.isObject) return false
    val text = new Rendered(envelope)
    val hash = XXH64.hashUnsafeBytes(text.bytes, Platform.BYTE_ARRAY_OFFSET, text.bytes.length, HashSeed)
    val head = Array[Any](false, record, hash, collectedAt, UTF8String.fromString(cluster), broker)
    stats.get("partitions") match {
      // Partitioned stats without per-partition detail are one topic's, as are a topic's own.
      case p if p == null || (p.isObject && p.size == 0) => statsRows(head, topic, partitioned(topic), stats, text, out)
      case partitions if partitions.isObject =>
        val base = UTF8String.fromString(topic)
        partitions.properties().asScala.forall(p => statsRows(head, p.getKey, base, p.getValue, text, out))
      case _ => false
    }
  }

  /** The envelope's text, as `Mapper.writeValueAsBytes` renders it, with where in it lies each value
   * a row keeps as text (a stats object's verbatim keys and children, the envelope's own or each
   * partition's): those texts are slices of it. Rendering them again took a fifth of this reader's
   * time on the large day, nearly as long as the envelope. The stats objects on that path are written
   * by ObjectNode.serialize's own steps, everything else by the nodes themselves. */
  private final class Rendered(envelope: JsonNode) {
    private val out = new ByteArrayBuilder()
    private val gen = Mapper.createGenerator(out)
    private val provider = Mapper.getSerializerProviderInstance
    private val ranges = new java.util.IdentityHashMap[JsonNode, (Int, Int)]()

    private def members(node: JsonNode)(write: (String, JsonNode) => Unit): Unit = {
      gen.writeStartObject(node)
      for (p <- node.properties().asScala) {
        gen.writeFieldName(p.getKey)
        write(p.getKey, p.getValue)
      }
      gen.writeEndObject()
    }

    private def kept(node: JsonNode): Unit = {
      gen.flush()
      val start = out.size + 1 // after the ':' the compact generator writes before a member's value
      node.serialize(gen, provider)
      gen.flush()
      ranges.put(node, (start, out.size))
    }

    private def stats(node: JsonNode): Unit =
      if (!node.isObject) node.serialize(gen, provider)
      else members(node) {
        case (key, value) if spec.verbatim.contains(key) => kept(value)
        case (key, value) if key == spec.children && spec.childJson && value.isObject => members(value)((_, child) => kept(child))
        case ("partitions", value) if value.isObject => members(value)((_, partition) => stats(partition))
        case (_, value) => value.serialize(gen, provider)
      }

    members(envelope) {
      case ("stats", value) => stats(value)
      case (_, value) => value.serialize(gen, provider)
    }
    gen.close()
    val bytes: Array[Byte] = out.toByteArray

    /** A value's text as Spark's from_json renders a value it reads as a string (a string as itself). */
    def apply(node: JsonNode): UTF8String = node match {
      case null => null
      case n if n.isNull => null
      case t: TextNode => UTF8String.fromString(t.textValue)
      case n =>
        val (start, end) = ranges.get(n)
        UTF8String.fromBytes(bytes, start, end - start)
    }
  }

  /** One topic's (or partition's) rows: one per child, or one without a child. */
  private def statsRows(head: Array[Any], topic: String, partitionedTopic: UTF8String, stats: JsonNode, text: Rendered,
      out: ArrayBuffer[InternalRow]): Boolean = {
    if (!stats.isObject) return false
    val topicStats = typed(stats, spec.topic, topic).getOrElse(return false)
    val texts = new GenericInternalRow(spec.verbatim.length)
    for ((key, i) <- spec.verbatim.zipWithIndex) texts.update(i, text(stats.get(key)))
    def row(child: UTF8String, childStats: InternalRow, childJson: UTF8String, childMean: Any): InternalRow =
      new GenericInternalRow(head ++ Array[Any](UTF8String.fromString(topic), partitionedTopic, topicStats, texts, child, childStats, childJson, childMean))
    stats.get(spec.children) match {
      case c if c == null || c.isNull || (c.isObject && c.size == 0) => out += row(null, null, null, null)
      case children if children.isObject =>
        for (c <- children.properties().asScala) {
          if (!c.getValue.isObject) return false
          val childStats = typed(c.getValue, spec.child, topic).getOrElse(return false)
          val childMean = spec.childMean.map(m => mean(c.getValue, m).getOrElse(return false)).orNull
          out += row(UTF8String.fromString(c.getKey), childStats, if (spec.childJson) text(c.getValue) else null, childMean)
        }
      case _ => return false
    }
    true
  }

  /** The fields of ``obj`` (of ``topic``) as the general parser types them, or None where it would find a problem. */
  private def typed(obj: JsonNode, fields: Seq[StatsField], topic: String): Option[InternalRow] = {
    val row = new GenericInternalRow(fields.length)
    var i = 0
    while (i < fields.length) {
      val f = fields(i)
      val node = obj.get(f.key)
      if (node == null || node.isNull) {
        if (f.requiredUnlessPrefix.exists(prefix => !topic.startsWith(prefix))) return None
      } else {
        val value: Any = (f.kind, node) match {
          case ("bigint", n @ (_: IntNode | _: LongNode)) if !(f.counter && n.longValue < 0) => n.longValue
          // A whole number written as a fraction (Pulsar 2.x's partitioned stats sum counters as
          // doubles: 3.5E4) is that number, as the general parser reads it.
          case ("bigint", n: DoubleNode) if isWhole(n.doubleValue) && !(f.counter && n.doubleValue < 0) => n.doubleValue.toLong
          case ("int", n: IntNode) if !(f.counter && n.intValue < 0) => n.intValue
          // A long as a double rounds as Spark's cast does; -0.0 is left to the general parser
          // (the VARIANT holds "-0.0" as a decimal, whose double is 0.0).
          case ("double", n @ (_: IntNode | _: LongNode)) => n.longValue.toDouble
          case ("double", n: DoubleNode) if !isNegativeZero(n.doubleValue) => n.doubleValue
          case ("boolean", b: BooleanNode) => b.booleanValue
          // Spark's rlike: the pattern found in the string.
          case ("string", t: TextNode) if (f.allowed.isEmpty || f.allowed.contains(t.textValue)) && f.pattern.forall(_.matcher(t.textValue).find()) =>
            UTF8String.fromString(t.textValue)
          case ("array<string>", a) if a.isArray && a.elements().asScala.forall(_.isObject) => a.size
          case (_, a) if f.members.nonEmpty && a.isArray => structs(a, f.members).getOrElse(return None)
          case _ => return None
        }
        row.update(i, value)
      }
      i += 1
    }
    Some(row)
  }

  /** ``m``'s mean over ``child`` as Spark's ``from_json`` of the child's text to
   * ``struct<array: array<struct<field: double>>>`` and an ``aggregate`` in array order give it
   * (null without a value at least ``min``: Some(null)); None where a value is no number, which
   * that parse may read otherwise (the general parser's file then). */
  private def mean(child: JsonNode, m: ChildMean): Option[Any] = child.get(m.array) match {
    case null => Some(null)
    case a if a.isNull => Some(null)
    case a if a.isArray =>
      var total = 0.0
      var known = 0
      for (element <- a.elements().asScala) {
        val value = element match {
          case o if o.isObject => o.get(m.field)
          case _ => return None
        }
        value match {
          case null =>
          case v if v.isNull =>
          case v @ (_: IntNode | _: LongNode | _: DoubleNode) =>
            if (v.doubleValue >= m.min) { total += v.doubleValue; known += 1 }
          case _ => return None
        }
      }
      Some(if (known > 0) total / known else null)
    case _ => None
  }

  /** An array of objects whose ``members`` are absent, null or whole numbers written as such, as
   * structs of longs (a member of another type, or an element that is no object: None). */
  private def structs(array: JsonNode, members: Array[String]): Option[GenericArrayData] = {
    val out = new Array[Any](array.size)
    var i = 0
    while (i < out.length) {
      val element = array.get(i)
      if (!element.isObject) return None
      val struct = new GenericInternalRow(members.length)
      var m = 0
      while (m < members.length) {
        element.get(members(m)) match {
          case null =>
          case n if n.isNull =>
          case n @ (_: IntNode | _: LongNode) => struct.update(m, n.longValue)
          case _ => return None
        }
        m += 1
      }
      out(i) = struct
      i += 1
    }
    Some(new GenericArrayData(out))
  }

  private def requiredText(obj: JsonNode, key: String): Option[String] = obj.get(key) match {
    case t: TextNode => Some(t.textValue)
    case _ => None
  }
}

object StatsEnvelopeRows {
  val Name = "brokerlens_stats_rows"
  private val Usage = s"$Name(raw, 'spec JSON', day_start, day_end)"
  // xxhash64's seed in Spark SQL (XxHash64), so a hash here equals xxhash64(text) there.
  private val HashSeed = 42L
  private val PartitionSuffix = Pattern.compile("-partition-[0-9]+$")

  // Strict JSON: a file the general parser would read differently (a duplicate key, trailing text,
  // NaN, a single-quoted string) fails here and goes to it (MetricsPageRows' headers too).
  private[jvm] val Mapper: ObjectMapper = JsonMapper
    .builder()
    .enable(StreamReadFeature.STRICT_DUPLICATE_DETECTION)
    .disable(JsonReadFeature.ALLOW_NON_NUMERIC_NUMBERS)
    .enable(DeserializationFeature.FAIL_ON_TRAILING_TOKENS)
    .enable(DeserializationFeature.FAIL_ON_READING_DUP_TREE_KEY)
    .build()

  private def isWhole(d: Double): Boolean = d == Math.floor(d) && Math.abs(d) < 4.0e18

  private def isNegativeZero(d: Double): Boolean = d == 0.0 && java.lang.Double.doubleToRawLongBits(d) != 0L

  /** The base name of a topic named as a partition (regexp_replace with the same pattern). */
  private def partitioned(topic: String): UTF8String = {
    val m = PartitionSuffix.matcher(topic)
    if (m.find()) UTF8String.fromString(m.replaceAll("")) else null
  }
}
