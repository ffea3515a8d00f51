package brokerlens.jvm

import java.nio.ByteBuffer
import java.nio.charset.{CharacterCodingException, StandardCharsets}
import java.util.regex.Pattern

import scala.collection.mutable
import scala.collection.mutable.ArrayBuffer
import scala.jdk.CollectionConverters._

import com.fasterxml.jackson.databind.ObjectMapper
import com.fasterxml.jackson.databind.node.TextNode

import org.apache.spark.sql.SparkSessionExtensions
import org.apache.spark.sql.catalyst.{FunctionIdentifier, InternalRow}
import org.apache.spark.sql.catalyst.expressions.{Expression, ExpressionInfo, GenericInternalRow}
import org.apache.spark.sql.catalyst.expressions.codegen.CodegenFallback
import org.apache.spark.sql.catalyst.util.{ArrayBasedMapData, DateTimeUtils, GenericArrayData}
import org.apache.spark.sql.types._
import org.apache.spark.unsafe.types.UTF8String

/**
 * Land's one-pass reader of a broker's `/metrics` page (land/metrics.py), as the Spark SQL function
 *
 * {{{
 * brokerlens_metrics_rows(raw, spec, day_start, day_end, ingested_at)
 * }}}
 *
 * `raw` is a whole file's text; `spec` (a constant JSON string, metrics.py's `read`) holds the
 * patterns of the general parser (metrics.py's `parse`, Spark SQL over the file's lines), the
 * metric types and the families that land. The result is the file's header, its largest
 * `cluster` label and sample timestamp, the count of samples of other families, and the samples
 * of the families that land, each parsed as the general parser parses it; or `left` true: the
 * general parser reads that file, line by line.
 *
 * It takes only files in which that parser finds no problem and whose lines Spark's text reader
 * splits as `\n` does: valid UTF-8 without a carriage return or a byte-order mark, no line starting
 * or ending in white space, at most one header (a JSON object: `collected_at` a `...Z` timestamp
 * string on the day, `cluster` a string, `broker` absent, null or a string), every `# TYPE` of a
 * known type, every other line a sample, a value in plain decimal or scientific notation (or
 * `NaN`, `+Inf`, `-Inf`), a timestamp on the day, no negative counter, no label named twice, no
 * sample repeated, and a cluster for the samples. The checks are the general parser's patterns,
 * matched as Spark's `rlike` matches them.
 */
class MetricsPageRowsExtension extends (SparkSessionExtensions => Unit) {
  override def apply(extensions: SparkSessionExtensions): Unit = {
    val info = new ExpressionInfo(classOf[MetricsPageRows].getName, MetricsPageRows.Name)
    extensions.injectFunction((FunctionIdentifier(MetricsPageRows.Name), info, (args: Seq[Expression]) => MetricsPageRows(args)))
  }
}

/** The general parser's patterns and sets (metrics.py), from the spec. */
final case class MetricsSpec(header: Pattern, typeLine: Pattern, sample: Pattern, label: Pattern, familySuffix: Pattern,
    types: Set[String], families: Set[String], familyPattern: Option[Pattern], keepAll: Boolean) {
  def lands(name: String): Boolean = keepAll || families.contains(name) || familyPattern.exists(_.matcher(name).find())
}

object MetricsSpec {
  def parse(json: String): MetricsSpec = {
    val node = new ObjectMapper().readTree(json)
    def pattern(key: String) = Pattern.compile(node.get(key).asText)
    def strings(key: String) = node.get(key).elements().asScala.map(_.asText).toSet
    MetricsSpec(pattern("header"), pattern("type"), pattern("sample"), pattern("label"), pattern("family_suffix"), strings("types"),
      strings("families"), Option(node.get("family_pattern")).filterNot(_.isNull).map(p => Pattern.compile(p.asText)),
      node.get("keep_all").asBoolean)
  }
}

case class MetricsPageRows(args: Seq[Expression]) extends Expression with CodegenFallback {
  import MetricsPageRows._

  override def children: Seq[Expression] = args
  override def nullable: Boolean = false
  override def foldable: Boolean = false
  override def dataType: DataType = ResultType

  @transient private lazy val spec: MetricsSpec = args match {
    case Seq(_, s, _, _, _) if s.foldable && s.dataType == StringType => MetricsSpec.parse(s.eval().toString)
    case _ => throw new IllegalArgumentException(s"$Usage, not $Name(${args.mkString(", ")})")
  }
  @transient private lazy val dayStart: Long = args(2).eval().asInstanceOf[Long]
  @transient private lazy val dayEnd: Long = args(3).eval().asInstanceOf[Long]

  override protected def withNewChildrenInternal(newChildren: IndexedSeq[Expression]): Expression = copy(args = newChildren)

  override def eval(input: InternalRow): Any = {
    val raw = args.head.eval(input).asInstanceOf[UTF8String]
    val ingestedAt = args(4).eval(input)
    val page = if (raw == null || ingestedAt == null) None else read(raw, ingestedAt.asInstanceOf[Long])
    page.getOrElse(leftRow)
  }

  private final class Sample(val line: Int, val raw: String, val metric: String, val labels: ArrayBasedMapData, val value: Double,
      val timestamp: Option[Long], val cluster: Option[String])

  /** The file's result row, or None when the general parser must read it. */
  private def read(raw: UTF8String, ingestedAt: Long): Option[InternalRow] = {
    val text = try StandardCharsets.UTF_8.newDecoder().decode(ByteBuffer.wrap(raw.getBytes)).toString
    catch { case _: CharacterCodingException => return None }
    if (text.indexOf('\r') >= 0 || text.indexOf('\uFEFF') >= 0) return None
    val lines = text.split("\n", -1)
    // Spark's text reader ends the last line at the end of the file: a final "\n" opens no line.
    val count = if (text.endsWith("\n")) lines.length - 1 else lines.length
    var header: Option[(Long, UTF8String, UTF8String)] = None
    val types = mutable.HashMap.empty[String, String]
    val samples = ArrayBuffer.empty[Sample]
    val seen = mutable.HashSet.empty[String]
    var notLanded = 0L
    var i = 0
    while (i < count) {
      val line = lines(i)
      if (line.nonEmpty) {
        if (line.head <= ' ' || line.last <= ' ') return None
        val headerMatch = spec.header.matcher(line)
        if (headerMatch.find()) {
          if (header.isDefined) return None
          header = Some(headerFields(headerMatch.group(1)).getOrElse(return None))
        } else {
          val typeMatch = spec.typeLine.matcher(line)
          if (typeMatch.find()) {
            val family = typeMatch.group(1)
            val kind = typeMatch.group(2)
            if (!spec.types.contains(kind)) return None
            // The general parser takes a family's least type by name (min).
            if (types.get(family).forall(kind < _)) types(family) = kind
          } else if (line.head != '#') {
            val m = spec.sample.matcher(line)
            if (!m.find()) return None
            val metric = m.group(1)
            if (!spec.lands(metric)) notLanded += 1
            else {
              if (!seen.add(line)) return None // a repeated sample is the general parser's duplicate
              samples += sample(i + 1, line, metric, Option(m.group(3)).getOrElse(""), m.group(4), Option(m.group(6)).getOrElse(""))
                .getOrElse(return None)
            }
          }
        }
      }
      i += 1
    }
    val fileCluster = samples.flatMap(_.cluster).map(UTF8String.fromString).reduceOption((a, b) => if (a.compareTo(b) >= 0) a else b)
    val fileStamp = samples.flatMap(_.timestamp).reduceOption((a: Long, b: Long) => math.max(a, b))
    if (samples.nonEmpty && header.isEmpty && fileCluster.isEmpty) return None // no cluster: the general parser's quarantine row
    if (header.isEmpty && fileStamp.isEmpty && samples.nonEmpty && (ingestedAt < dayStart || ingestedAt >= dayEnd)) return None
    val rows = new Array[Any](samples.length)
    var s = 0
    while (s < samples.length) {
      val x = samples(s)
      val kind = types.get(x.metric).orElse(types.get(spec.familySuffix.matcher(x.metric).replaceAll(""))).orNull
      if (kind == "counter" && x.value < 0) return None
      rows(s) = new GenericInternalRow(Array[Any](x.line, UTF8String.fromString(x.raw), UTF8String.fromString(x.metric),
        UTF8String.fromString(kind), x.labels, x.value, x.timestamp.getOrElse(null)))
      s += 1
    }
    val (collectedAt, cluster, broker) = header.map { case (at, c, b) => (at: Any, c, b) }.getOrElse((null, null, null))
    Some(new GenericInternalRow(Array[Any](false, notLanded, collectedAt, cluster, broker, fileCluster.orNull, fileStamp.getOrElse(null),
      new GenericArrayData(rows))))
  }

  /** A sample of a family that lands, as the general parser has it, or None where it finds a problem. */
  private def sample(line: Int, raw: String, metric: String, labelsText: String, valueText: String, stampText: String): Option[Sample] = {
    val keys = ArrayBuffer.empty[UTF8String]
    val values = ArrayBuffer.empty[UTF8String]
    val names = mutable.HashSet.empty[String]
    var cluster: Option[String] = None
    val m = spec.label.matcher(labelsText)
    while (m.find()) {
      val name = m.group(1)
      if (!names.add(name)) return None // a map with a key twice: the general parser's error, not ours
      val value = unescape(m.group(2))
      if (name == "cluster") cluster = Some(value)
      keys += UTF8String.fromString(name)
      values += UTF8String.fromString(value)
    }
    val value = number(valueText).getOrElse(return None)
    val timestamp =
      if (stampText.isEmpty) None
      else if (stampText.length > 15) return None
      else {
        val us = stampText.toLong * 1000L
        if (us < dayStart || us >= dayEnd) return None
        Some(us)
      }
    Some(new Sample(line, raw, metric, new ArrayBasedMapData(new GenericArrayData(keys.toArray[Any]), new GenericArrayData(values.toArray[Any])),
      value, timestamp, cluster))
  }

  /** (collected_at, cluster, broker) of a header whose JSON the general parser finds nothing to say about. */
  private def headerFields(json: String): Option[(Long, UTF8String, UTF8String)] = {
    val node = try StatsEnvelopeRows.Mapper.readTree(json) catch { case _: Exception => return None }
    if (node == null || !node.isObject) return None
    val at = node.get("collected_at") match {
      case t: TextNode if Timestamp.matcher(t.textValue).matches() =>
        DateTimeUtils.stringToTimestamp(UTF8String.fromString(t.textValue), java.time.ZoneOffset.UTC) match {
          case Some(us) if us >= dayStart && us < dayEnd => us
          case _ => return None
        }
      case _ => return None
    }
    val cluster = node.get("cluster") match {
      case t: TextNode => UTF8String.fromString(t.textValue)
      case _ => return None
    }
    val broker = node.get("broker") match {
      case null => null
      case n if n.isNull => null
      case t: TextNode => UTF8String.fromString(t.textValue)
      case _ => return None
    }
    Some((at, cluster, broker))
  }
}

object MetricsPageRows {
  val Name = "brokerlens_metrics_rows"
  private val Usage = s"$Name(raw, 'spec JSON', day_start, day_end, ingested_at)"

  val SampleType: StructType = StructType(Seq(
    StructField("line", IntegerType),
    StructField("raw", StringType),
    StructField("metric", StringType),
    StructField("metric_type", StringType),
    StructField("labels", MapType(StringType, StringType)),
    StructField("value", DoubleType),
    StructField("sample_timestamp", TimestampType)))
  val ResultType: StructType = StructType(Seq(
    StructField("left", BooleanType),
    StructField("not_landed", LongType),
    StructField("header_collected_at", TimestampType),
    StructField("header_cluster", StringType),
    StructField("header_broker", StringType),
    StructField("file_cluster", StringType),
    StructField("file_stamp", TimestampType),
    StructField("samples", ArrayType(SampleType, containsNull = false))))

  private def leftRow: InternalRow = new GenericInternalRow(Array[Any](true, 0L, null, null, null, null, null, new GenericArrayData(Array.empty[Any])))

  // A header's collected_at as both of Spark's timestamp parsers read it alike.
  private val Timestamp = Pattern.compile("[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\\.[0-9]{3})?Z")
  // A sample value Spark's cast to double reads as Java's Double.parseDouble does.
  private val Decimal = Pattern.compile("[+-]?([0-9]+(\\.[0-9]*)?|\\.[0-9]+)([eE][+-]?[0-9]+)?")
  private val EscapedQuote = Pattern.compile("\\\\([\"\\\\])")
  private val EscapedNewline = Pattern.compile("\\\\n")

  /** metrics.py's ``_value``: Inf, -Inf and NaN by name (any case), else a number. */
  private def number(text: String): Option[Double] = text.toLowerCase(java.util.Locale.ROOT) match {
    case "+inf" | "inf" => Some(Double.PositiveInfinity)
    case "-inf" => Some(Double.NegativeInfinity)
    case "nan" => Some(Double.NaN)
    case _ if Decimal.matcher(text).matches() => Some(java.lang.Double.parseDouble(text))
    case _ => None
  }

  /** A label value's escapes (`\"`, `\\`, `\n`), undone as metrics.py's ``_lines`` undoes them. */
  private def unescape(v: String): String =
    if (!v.contains("\\")) v else EscapedNewline.matcher(EscapedQuote.matcher(v).replaceAll("$1")).replaceAll("\n")
}
