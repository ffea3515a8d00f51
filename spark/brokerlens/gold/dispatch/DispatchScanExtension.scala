package brokerlens.jvm

import scala.jdk.CollectionConverters._

import org.apache.spark.rdd.RDD
import org.apache.spark.sql.SparkSessionExtensions
import org.apache.spark.sql.catalyst.{FunctionIdentifier, InternalRow}
import org.apache.spark.sql.catalyst.expressions.{
  Ascending, Attribute, AttributeReference, AttributeSet, Expression, ExpressionInfo,
  FunctionTableSubqueryArgumentExpression, Literal, SortOrder, UnsafeProjection
}
import org.apache.spark.sql.catalyst.plans.logical.{LogicalPlan, UnaryNode}
import org.apache.spark.sql.catalyst.plans.physical.{ClusteredDistribution, Distribution, Partitioning}
import org.apache.spark.sql.execution.{InputRDDCodegen, SparkPlan, SparkStrategy, UnaryExecNode}
import org.apache.spark.sql.internal.SQLConf
import org.apache.spark.sql.types.{DataType, LongType, StringType, StructType}

/**
 * Gold dispatch's one-pass scan (DispatchScan.java) as a Spark SQL table function, so that any
 * session reaches it through SQL, a Spark Connect one included:
 *
 * {{{
 * SELECT * FROM brokerlens_dispatch_scan(TABLE(rows), 'scope,columns', 'caught_up', 'cursor',
 *                                        'backlog', 'scrape', 'token-bucket')
 * }}}
 *
 * (the constants are DispatchScan.layout's: the cursor state not charged, the markers' sources,
 * the counter rows' grain and the limiter model judged as a bucket; without the last three, no
 * starved empty periods are counted).
 *
 * The physical operator asks the planner for each scope's rows in one partition, in
 * (scope, t0_us, is_record) order, so the exchange and the sort are Spark's own and adaptive
 * execution plans them like any other. Registered with `spark.sql.extensions`.
 */
class DispatchScanExtension extends (SparkSessionExtensions => Unit) {
  override def apply(extensions: SparkSessionExtensions): Unit = {
    val info = new ExpressionInfo(classOf[DispatchScanNode].getName, DispatchScanNode.Name)
    extensions.injectTableFunction((FunctionIdentifier(DispatchScanNode.Name), info, DispatchScanNode.build _))
    extensions.injectCheckRule(_ => DispatchScanNode.check)
    extensions.injectPlannerStrategy(_ => DispatchScanStrategy)
  }
}

case class DispatchScanNode(
    scope: Seq[String],
    constants: Seq[String],
    added: Seq[Attribute],
    child: LogicalPlan)
    extends UnaryNode {
  override def output: Seq[Attribute] = child.output ++ added
  override def producedAttributes: AttributeSet = AttributeSet(added)
  // The scan reads its input's columns and passes all of them on: none may be pruned under it.
  override lazy val references: AttributeSet = child.outputSet
  override protected def withNewChildInternal(newChild: LogicalPlan): DispatchScanNode = copy(child = newChild)
}

object DispatchScanNode {
  val Name = "brokerlens_dispatch_scan"
  private val Usage = s"$Name(TABLE(rows), 'scope columns, comma-separated', 'caught-up cursor state', " +
    "'cursor source'[, 'backlog source', 'scrape grain', 'token bucket model'])"

  /** The function's plan; its added columns get their attribute ids here, once. */
  def build(args: Seq[Expression]): LogicalPlan = args match {
    case (rows: FunctionTableSubqueryArgumentExpression) +: strings
        if (strings.size == 3 || strings.size == 6) && strings.forall { case Literal(v, StringType) => v != null; case _ => false } =>
      val values = strings.map(_.asInstanceOf[Literal].value.toString)
      val added = DispatchScan.OUTPUTS.toSeq.map(name => AttributeReference(name, outputType(name))())
      DispatchScanNode(values.head.split(",").toSeq, values.tail, added, rows.plan)
    case _ => throw new IllegalArgumentException(s"$Usage, not $Name(${args.mkString(", ")})")
  }

  /** The scan's column positions in `in`, checked; midnight in the session's time zone. */
  def layout(in: StructType, scope: Seq[String], constants: Seq[String]): DispatchScan.Layout = {
    val Seq(caughtUp, cursorSource, backlogSource, scrapeGrain, tokenBucket) = constants.padTo(5, null)
    DispatchScan.layout(in, scope.asJava, caughtUp, cursorSource, backlogSource, scrapeGrain, tokenBucket,
      SQLConf.get.sessionLocalTimeZone)
  }

  private def outputType(name: String): DataType = if (name == DispatchScan.OUTPUTS(0)) StringType else LongType

  /** A missing or mistyped input column, named when the query is analysed rather than run. */
  def check(plan: LogicalPlan): Unit = plan.foreach {
    case node: DispatchScanNode => layout(node.child.schema, node.scope, node.constants)
    case _ =>
  }
}

object DispatchScanStrategy extends SparkStrategy {
  override def apply(plan: LogicalPlan): Seq[SparkPlan] = plan match {
    case node: DispatchScanNode =>
      DispatchScanExec(node.scope, node.constants, node.added, planLater(node.child)) :: Nil
    case _ => Nil
  }
}

case class DispatchScanExec(
    scope: Seq[String],
    constants: Seq[String],
    added: Seq[Attribute],
    child: SparkPlan)
    extends UnaryExecNode
    with InputRDDCodegen {
  override def output: Seq[Attribute] = child.output ++ added
  override def producedAttributes: AttributeSet = AttributeSet(added)

  private def column(name: String): Attribute = child.output.find(_.name == name).get

  override def requiredChildDistribution: Seq[Distribution] = ClusteredDistribution(scope.map(column)) :: Nil

  override def requiredChildOrdering: Seq[Seq[SortOrder]] =
    (scope :+ "t0_us" :+ "is_record").map(name => SortOrder(column(name), Ascending)) :: Nil

  // The scan passes its rows on in the order and partitions it read them.
  override def outputPartitioning: Partitioning = child.outputPartitioning
  override def outputOrdering: Seq[SortOrder] = child.outputOrdering

  // The scan's rows are the input of the generated code of the operators after it, which reads
  // only the columns they use (RDDScanExec's way): an unsafe copy of every row would cost a
  // sixth of the scan's query. Its child's operators run on their own (SortExec's doExecute).
  override protected val createUnsafeProjection: Boolean = true

  // Within its whole-stage code the scan is the input, as Spark's InputAdapter is: its loop may
  // stop at a limit after it (Spark logs a "[BUG]" warning for other operators that check).
  override def canCheckLimitNotReached: Boolean = true

  override def inputRDD: RDD[InternalRow] = {
    val layout = DispatchScanNode.layout(child.schema, scope, constants)
    child.execute().mapPartitions(rows => DispatchScan.scan(layout, rows.asJava).asScala)
  }

  override protected def doExecute(): RDD[InternalRow] = {
    val schema = this.schema
    inputRDD.mapPartitions { rows =>
      // Spark's operators after this one (an exchange among them) take unsafe rows only.
      val unsafe = UnsafeProjection.create(schema)
      rows.map(unsafe)
    }
  }

  override protected def withNewChildInternal(newChild: SparkPlan): DispatchScanExec = copy(child = newChild)
}
