"""Readiness reports in the database: every control-plane replica answers from the same reports.

Revision ID: 0008
Revises: 0007
"""
from alembic import op
import sqlalchemy as sa


revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('readiness_reports',
    sa.Column('source', sa.String(length=200), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('revision', sa.Integer(), nullable=False),
    sa.Column('report', sa.JSON(), nullable=False),
    sa.Column('received_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('source')
    )
    op.create_index('ix_readiness_reports_received_at', 'readiness_reports', ['received_at'])


def downgrade() -> None:
    op.drop_index('ix_readiness_reports_received_at', table_name='readiness_reports')
    op.drop_table('readiness_reports')
