"""Console sessions in the database: every control-plane replica knows every signed-in browser.

Revision ID: 0009
Revises: 0008
"""
from alembic import op
import sqlalchemy as sa


revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('console_sessions',
    sa.Column('key', sa.String(length=64), nullable=False),
    sa.Column('sealed', sa.Text(), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('role', sa.String(length=16), nullable=False),
    sa.Column('notice', sa.JSON(), nullable=True),
    sa.Column('opened_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('seen_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('key')
    )
    op.create_index('ix_console_sessions_seen_at', 'console_sessions', ['seen_at'])


def downgrade() -> None:
    op.drop_index('ix_console_sessions_seen_at', table_name='console_sessions')
    op.drop_table('console_sessions')
