"""Endpoints: engine options of LLM engines (vllm: dtype, max_model_len, an external engine's url, ...).

Revision ID: 0005
Revises: 0004
"""
from alembic import op
import sqlalchemy as sa


revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('endpoints', schema=None) as batch_op:
        batch_op.add_column(sa.Column('engine_options', sa.JSON(), nullable=False, server_default='{}'))


def downgrade() -> None:
    with op.batch_alter_table('endpoints', schema=None) as batch_op:
        batch_op.drop_column('engine_options')
